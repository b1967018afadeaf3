"""Large calls without a token against a sidecar, and the server's RSS around them (issue 32, item 9).

Shared by the stress probe (``tests/stress/test_auth_stress.py``) and the benchmark
(``bench/refused_uploads.py``): Linux only (``/proc/<pid>/status`` and ``clear_refs``, proc(5)).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc
import yaml

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "deployment.yaml"
"""The shipped Kubernetes manifest, whose sidecar memory limit the probes stay under."""


def shipped_memory_limit() -> int:
    """The sidecar container's ``resources.limits.memory`` in the shipped manifest, in bytes."""
    pod = yaml.safe_load(MANIFEST.read_text())["spec"]["template"]["spec"]
    (sidecar,) = [c for c in pod["initContainers"] + pod["containers"] if c["name"] == "turnwire"]
    quantity = sidecar["resources"]["limits"]["memory"]
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * {"Mi": 2**20, "Gi": 2**30}[unit]


def status_bytes(pid: int, field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of /proc/<pid>/status, in bytes."""
    found = re.search(rf"^{field}:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found is not None, field
    return int(found.group(1)) * 1024


def reset_peak(pid: int) -> None:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS (proc(5): clear_refs, 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def tokenless_chats(
    target: str, pid: int, *, calls: int, rounds: int, request_bytes: int, call_deadline: float
) -> tuple[int, int, float]:
    """``calls`` concurrent Chat calls of ``request_bytes`` without a token, one connection each (as
    separate attackers: nothing shared between streams), ``rounds`` times, against the server at
    ``target`` whose process is ``pid``, each call with a deadline of ``call_deadline`` seconds:
    (RSS before, peak RSS, seconds). Raises AssertionError when
    any call ends other than ``UNAUTHENTICATED``."""
    request = chat_service_pb2.ChatRequest(conversation_id="c")
    request.message.parts.add().text.text = "y" * request_bytes
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", 2**25)])
        for _ in range(calls)
    ]

    async def call(channel: grpc.aio.Channel) -> grpc.StatusCode:
        try:
            async for _ in chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
                request, timeout=call_deadline
            ):
                pass
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK

    try:
        reset_peak(pid)
        before = status_bytes(pid, "VmRSS")
        started = time.monotonic()
        for _ in range(rounds):
            codes = set(await asyncio.gather(*(call(channel) for channel in channels)))
            assert codes == {grpc.StatusCode.UNAUTHENTICATED}, codes
        return before, status_bytes(pid, "VmHWM"), time.monotonic() - started
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
