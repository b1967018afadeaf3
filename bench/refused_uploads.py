"""What callers without a token can make the sidecar hold, and what a caller with one waits (issue 32 item 9).

1. **Refused uploads.** A sidecar with ``auth:`` on; N concurrent ``Chat`` calls, each a 15 MiB
   request and no token, each on its own connection, for R rounds. Server RSS before and its
   peak (the kernel's ``VmHWM``, reset first, so no sample can miss it), against the memory limit
   of ``deploy/kubernetes/deployment.yaml`` (512 MiB). Every call must end ``UNAUTHENTICATED``.
2. **Uploads that are read.** Time from sending an authenticated ``Chat`` with a large message
   to its ``TurnStart``, straight and through a local proxy that delays every chunk by
   ``--delay-ms`` each way (a round trip of twice that): the server's HTTP/2 receive window
   (``grpc.http2.bdp_probe`` off, ``turnwire_server.app.grpc_options``) must not make a legitimate
   upload crawl at 64 KiB per round trip.

    .venv/bin/python bench/refused_uploads.py                 # 8, 32 and 64 calls; 900 KiB uploads
    .venv/bin/python bench/refused_uploads.py --calls 32 --rounds 5

Printed only (a table); ``tests/stress/test_auth_stress.py`` asserts the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import secrets
import sys
import tempfile
import time
from pathlib import Path

import grpc
import yaml
from _common import PYTHON, REPO, ServerProcess, free_port

sys.path.insert(0, str(REPO / "tests"))  # the probe shared with tests/stress/test_auth_stress.py
from support.tokenless_calls import shipped_memory_limit, tokenless_chats

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc

MIB = 2**20


def sidecar(workdir: Path, token: str) -> ServerProcess:
    """A sidecar with one static token (``token``) and the scripted default model."""
    port = free_port()
    tokens = workdir / "tokens.json"
    digest = hashlib.sha256(token.encode()).hexdigest()
    tokens.write_text(f'{{"tokens": [{{"sha256": "{digest}", "principal": "bench", "tenant": "t"}}]}}')
    config = workdir / f"turnwire-{port}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{port}",
                "store": {"url": f"sqlite:///{workdir / f'turnwire-{port}.db'}"},
                "auth": {"enabled": True, "tokens_file": str(tokens)},
                "tools": {"demo": False},
            }
        )
    )
    return ServerProcess(
        [PYTHON, "-m", "turnwire_server", "serve", "--config", str(config)], port, workdir, "turnwire"
    )


async def delayed_proxy(target_port: int, delay: float) -> tuple[asyncio.Server, int]:
    """A TCP proxy on a free port that forwards each chunk ``delay`` seconds late, each way."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not chunk:
                    writer.close()
                    return
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while chunk := await reader.read(65536):
                queue.put_nowait((time.monotonic() + delay, chunk))
        finally:
            queue.put_nowait((time.monotonic() + delay, b""))
            await asyncio.gather(sender, return_exceptions=True)

    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelled when the proxy closes with connections open: nothing to report then.
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    port = free_port()
    return await asyncio.start_server(connect, "127.0.0.1", port), port


async def upload_seconds(target: str, token: str, message_bytes: int, repeats: int = 5) -> float:
    """Median time from sending an authenticated Chat of ``message_bytes`` to its first event."""
    times = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        for index in range(repeats):
            request = chat_service_pb2.ChatRequest(conversation_id=f"upload-{index}-{secrets.token_hex(4)}")
            request.message.parts.add().text.text = "y" * message_bytes
            started = time.monotonic()
            call = stub.Chat(request, metadata=[("authorization", f"Bearer {token}")], timeout=120)
            first = await call.read()
            times.append(time.monotonic() - started)
            assert first is not grpc.aio.EOF and first.event.HasField("turn_start"), first
            call.cancel()
    return sorted(times)[len(times) // 2]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", default="8,32,64", help="concurrent tokenless calls, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--request-mib", type=float, default=15.0)
    parser.add_argument("--upload-kib", type=int, default=900, help="authenticated message size")
    parser.add_argument("--delay-ms", type=float, default=25.0, help="proxy delay each way")
    options = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("reads /proc/<pid>/status: Linux only")
    limit = shipped_memory_limit()
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory() as directory:
        server = sidecar(Path(directory), token)
        await server.start()
        try:
            print(
                f"| tokenless calls x {options.request_mib:g} MiB | rounds | RSS before MiB | peak MiB | "
                f"peak - before MiB | per call KiB | under {limit // MIB} Mi | seconds |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for calls in (int(n) for n in options.calls.split(",")):
                assert server.popen is not None
                before, peak, seconds = await tokenless_chats(
                    server.target,
                    server.popen.pid,
                    calls=calls,
                    rounds=options.rounds,
                    request_bytes=int(options.request_mib * MIB),
                    call_deadline=120,
                )
                print(
                    f"| {calls} | {options.rounds} | {before / MIB:.0f} | {peak / MIB:.0f} | "
                    f"{(peak - before) / MIB:.1f} | {(peak - before) / calls / 1024:,.0f} | "
                    f"{'yes' if peak < limit else 'NO'} | {seconds:.1f} |"
                )
            proxy, proxy_port = await delayed_proxy(server.port, options.delay_ms / 1000)
            async with proxy:
                straight = await upload_seconds(server.target, token, options.upload_kib * 1024)
                delayed = await upload_seconds(f"127.0.0.1:{proxy_port}", token, options.upload_kib * 1024)
            rtt = 2 * options.delay_ms
            print()
            print(
                f"| authenticated {options.upload_kib} KiB Chat to TurnStart | straight ms | "
                f"through a {rtt:g} ms RTT proxy ms | round trips |"
            )
            print("|---|---|---|---|")
            print(
                f"| median of 5 | {straight * 1000:.0f} | {delayed * 1000:.0f} | {delayed * 1000 / rtt:.1f} |"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
