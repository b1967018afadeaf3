"""``buf curl`` (from node_modules, installed by ``make setup``): an independent gRPC client,
written in Go, that speaks both server reflection versions (``--reflect-protocol grpc-v1`` or
``grpc-v1alpha``) and TLS (``--cacert``, ``--cert``, ``--key``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

BUF = Path(__file__).resolve().parents[2] / "node_modules" / ".bin" / "buf"


async def buf_curl(*args: str, timeout: float = 60.0) -> str:  # noqa: ASYNC109
    """Run ``buf curl --protocol grpc ARGS`` to its end; its stdout.

    Raises:
        AssertionError: it exited non-zero (the message is its stderr).
        TimeoutError: it ran longer than ``timeout`` seconds.
    """
    process = await asyncio.create_subprocess_exec(
        str(BUF),
        "curl",
        "--protocol",
        "grpc",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, f"buf curl {' '.join(args)}: exit {process.returncode}: {err.decode()}"
    return out.decode()


async def list_services(url: str, reflect_protocol: str, *flags: str) -> list[str]:
    """The services ``url``'s reflection lists (``buf curl --list-services``), sorted;
    ``flags``: more ``buf curl`` flags (TLS files, ``--http2-prior-knowledge``)."""
    out = await buf_curl("--list-services", "--reflect-protocol", reflect_protocol, *flags, url)
    return sorted(out.split())
