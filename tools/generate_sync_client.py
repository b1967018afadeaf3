"""Generate the synchronous Python client from the async one.

``clients/python/src/turnwire_client/client.py`` (:class:`TurnwireClient`, on ``grpc.aio``) is
the source; this writes ``_sync_client.py`` beside it (:class:`SyncTurnwireClient`, on gRPC's
thread-based channel) with unasync's token rewrite (``async``/``await`` dropped,
``__aenter__`` → ``__enter__`` …) plus the renames below, then ``ruff format``. What a plain
rewrite cannot produce stays hand-written: the turn stream (``sync_stream.py``: gRPC's sync
stream is an iterator, not ``read()`` until EOF) and the public module ``sync.py``.

    python tools/generate_sync_client.py           # regenerate in place
    python tools/generate_sync_client.py DIR       # write DIR/_sync_client.py (the drift check)

Every docstring replacement must match: a changed async docstring fails the generation instead
of leaving async wording in the sync client.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients/python/src/turnwire_client"
SOURCE = PACKAGE / "client.py"
TARGET_NAME = "_sync_client.py"

HEADER = '''"""GENERATED from client.py by tools/generate_sync_client.py: do not edit; run
``make sync-client``. The public module is :mod:`turnwire_client.sync`."""'''

# Names (tokens, and strings that are exactly a name), on top of unasync's own table.
NAMES = {
    "TurnwireClient": "SyncTurnwireClient",
    "TurnStream": "SyncTurnStream",
    "stream": "sync_stream",  # the module turnwire_client.stream
    "AioRpcError": "RpcError",
    # The schedule calls' mixins (_schedules.py: the sync one delegates to the same request builder).
    "ScheduleCalls": "SyncScheduleCalls",
}

# Text (docstrings and comments), applied in order; each must match at least once.
TEXT: list[tuple[str, str]] = [
    (r"grpc\.aio\.", "grpc."),
    (r"\bTurnStream\b", "SyncTurnStream"),
    (r"\bTurnwireClient\b", "SyncTurnwireClient"),
    (r"Async client for", "Synchronous client for"),
    (r"an async context manager", "a context manager"),
    (r"``async with`` exit", "``with`` exit"),
    (r"``async for``", "``for``"),
    (r"async with SyncTurnwireClient", "with SyncTurnwireClient"),
    (r"await collect\((client\.chat\([^)]*\))\)", r"\1.collect()"),
    (r"``await stream\.collect\(\)``", "``stream.collect()``"),
    (
        r"Create the client inside a running event loop; grpc\.aio channels bind to it\.",
        "Safe to use from several threads (gRPC channels are).",
    ),
    (r"  # noqa: ASYNC109 - a gRPC deadline, sent to the server", ""),
    (r" *# The stub's aio overload is not picked while grpc is untyped; say what it is\.\n", ""),
    # The sync stub needs no cast (the cast, and then its import, go).
    (
        r'cast\(\s*"chat_service_pb2_grpc\.ChatServiceAsyncStub",\s*'
        r"(chat_service_pb2_grpc\.ChatServiceStub\(self\._channel\)),\s*\)",
        r"\1",
    ),
    # The TLS probe blocks: the async client runs it on a thread, the sync one calls it.
    (r"asyncio\.to_thread\(explain_unreachable, ", "explain_unreachable("),
    # The async module's re-exports (ClientToolSpec …) stay there; turnwire_client.sync exports this.
    (r"__all__ = \[[^\]]*\]", '__all__ = ["SyncTurnwireClient"]'),
]


def generate(out_dir: Path) -> Path:
    """Write ``out_dir/_sync_client.py`` from client.py; returns its path. Raises
    :class:`SystemExit` when a text replacement no longer matches."""
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch, "_async", "client.py")
        source.parent.mkdir()
        source.write_text(SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
        rule = unasync.Rule("/_async/", "/_sync/", additional_replacements=NAMES)
        unasync.unasync_files([str(source)], rules=[rule])
        text = Path(scratch, "_sync", "client.py").read_text(encoding="utf-8")
    text = re.sub(r'\A""".*?"""', lambda _: HEADER, text, count=1, flags=re.DOTALL)
    for pattern, replacement in TEXT:
        text, count = re.subn(pattern, replacement, text)
        if count == 0:
            raise SystemExit(f"generate_sync_client: {pattern!r} no longer occurs in {SOURCE.name}")
    target = out_dir / TARGET_NAME
    target.write_text(text, encoding="utf-8")
    # The repository's ruff settings wherever the file is (the drift check writes to a scratch dir).
    ruff, config = str(Path(sys.executable).with_name("ruff")), ["--config", str(ROOT / "pyproject.toml")]
    subprocess.run(
        [ruff, "check", *config, "--quiet", "--fix", "--select", "I,F401", str(target)], check=True
    )
    subprocess.run([ruff, "format", *config, "--quiet", str(target)], check=True)
    return target


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE)
