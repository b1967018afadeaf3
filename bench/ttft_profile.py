"""Profile the sidecar under ``ttft.py``'s sequential-turn load with py-spy (diagnostic, not in the
suite): the top frames by share of the sidecar's CPU samples, self and inclusive.

Starts the upstream and one sidecar (no middleware), seeds a conversation with ``--history``
prior turns, attaches ``py-spy record`` (collapsed stacks, ``--rate`` Hz, idle frames dropped) to
the sidecar and runs ``--turns`` sequential turns on that conversation (``--history 0``: a new
conversation per turn) through ``--api``. Needs py-spy (``.venv/bin/pip install py-spy``) and the
right to ptrace the sidecar (root, or ``kernel.yama.ptrace_scope = 0``).

    .venv/bin/python bench/ttft_profile.py [--api openai] [--history 1000] [--turns 200] [--deltas 4]
        [--streams 1] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _ttft_clients import SidecarClient, Upstream, sidecar  # noqa: E402
from _ttft_clients import new_conversation_id as _new_id  # noqa: E402


def summarize(collapsed: Path, top: int) -> str:
    """Top ``top`` frames by self and by inclusive share of all samples (markdown lines)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue  # a frame name py-spy printed over several lines: a few samples lost
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples", "", "| self % | frame |", "|---|---|"]
    lines += [f"| {100 * n / total:.1f} | `{frame}` |" for frame, n in own.most_common(top)]
    lines += ["", "| inclusive % | frame |", "|---|---|"]
    lines += [f"| {100 * n / total:.1f} | `{frame}` |" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=("openai", "anthropic"), default="openai")
    parser.add_argument("--history", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--deltas", type=int, default=4, help="text deltas per answer (burst-N)")
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument(
        "--streams", type=int, default=1, help="concurrent turns (each a new conversation when > 1)"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, help="keep the collapsed stacks here")
    parser.add_argument(
        "--gil", action="store_true", help="only samples of the thread holding the interpreter lock"
    )
    parser.add_argument("--threads", action="store_true", help="each sample's thread as its first frame")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
    upstream = Upstream()
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-profile-") as tmp:
        server = sidecar(Path(tmp), upstream.url, 0)
        await server.start()
        client = SidecarClient(server.target)
        conversation = _new_id()
        await client.seed(conversation, args.history)
        model = f"{args.api}:burst-{args.deltas}"
        for _ in range(5):
            await client.turn(conversation if args.history else _new_id(), model)
        out = args.out or Path(tmp) / "stacks.txt"
        assert server.popen is not None
        spy = subprocess.Popen(  # noqa: ASYNC220 - py-spy runs beside the load, not awaited
            [
                py_spy,
                "record",
                "--pid",
                str(server.popen.pid),
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "--function",
                "--output",
                str(out),
                "--nonblocking",
                *(["--gil"] if args.gil else []),
                *(["--threads"] if args.threads else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.0)  # py-spy attaches
        if args.streams > 1:  # --turns split over --streams concurrent workers, new conversations

            async def worker(turns: int) -> None:
                for _ in range(turns):
                    await client.turn(_new_id(), model)

            await asyncio.gather(*(worker(args.turns // args.streams) for _ in range(args.streams)))
        else:
            for _ in range(args.turns):
                await client.turn(conversation if args.history else _new_id(), model)
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(30)
        await client.close()
        server.stop()
        print(
            f"{args.api}, {args.history} prior turns, {args.turns} turns of {args.deltas} deltas,"
            f" {args.streams} stream(s)"
        )
        print(summarize(out, args.top))
    upstream.close()


if __name__ == "__main__":
    asyncio.run(main())
