"""What the door benchmarks (``openai_door.py``, ``ai_sdk_door.py``, ``ag_ui_door.py``) measure
alike: sequential turns per protocol against native gRPC on one sidecar (server CPU per request
from the sidecar process's CPU per block of turns, time to first token), and a door's own CPU per
call in process."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from _common import CLIENT_OPTIONS, ServerProcess, Table, free_port, percentile, wait_for_quiet
from _ttft_clients import QUESTION, Upstream, upstream_sidecar
from google.protobuf import json_format

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2

FirstToken = Callable[[], Awaitable[float]]
"""One turn over one protocol, read to its end; seconds from the call to its first text delta."""


@asynccontextmanager
async def sidecar_with_doors(name: str) -> AsyncIterator[tuple[ServerProcess, FirstToken, str]]:
    """The benches' sidecar (:func:`sidecar`: SQLite, the ``openai`` provider on a local
    upstream, ``http.listen`` on) started in a temp dir named after ``name``; yields it, the
    baseline (a Chat over native gRPC) and the HTTP listener's base URL (``http://127.0.0.1:<port>``).
    Stops both processes on exit."""
    upstream = Upstream()
    http_port = free_port()
    server = sidecar(Path(tempfile.mkdtemp(prefix=f"turnwire-bench-{name}-")), upstream.url, http_port)
    try:
        await server.start(startup_seconds=120.0)
        async with grpc.aio.insecure_channel(server.target, options=CLIENT_OPTIONS) as channel:
            stub = chat_service_pb2_grpc.ChatServiceStub(channel)
            yield server, lambda: first_token(stub.Chat(request())), f"http://127.0.0.1:{http_port}"
    finally:
        server.stop()
        upstream.close()


MODEL = "openai:burst-4"
"""The model the door benches' turns name: the local upstream's 4-delta answer."""


def sidecar(workdir: Path, upstream: str, http_port: int) -> ServerProcess:
    """The sidecar under test (not yet started), with the HTTP listener on ``http_port``."""
    return upstream_sidecar(workdir, upstream, MODEL, f"http:\n  listen: 127.0.0.1:{http_port}\n")[0]


def request() -> chat_service_pb2.ChatRequest:
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = QUESTION
    return chat_service_pb2.ChatRequest(
        conversation_id=f"b-{uuid.uuid4().hex[:12]}", message=message, model=MODEL
    )


async def first_token(events: Any) -> float:
    """Read a Chat to its end; seconds from the call to its first text delta."""
    start = time.perf_counter()
    first = 0.0
    async for response in events:
        if not first and response.event.WhichOneof("event") == "text_delta":
            first = time.perf_counter() - start
    if not first:
        raise RuntimeError("no text delta")
    return first


def _events() -> list[chat_service_pb2.ChatResponse]:
    """A 4-delta turn's events, as the sidecar sends them."""
    kinds: list[dict[str, Any]] = [
        {"turn_start": {"message_id": "tw-a-1", "model": MODEL}},
        {"step_start": {}},
        {"text_start": {"id": "s0-t"}},
        *({"text_delta": {"id": "s0-t", "delta": word}} for word in ("The ", "quick ", "brown ", "fox.")),
        {"text_end": {"id": "s0-t"}},
        {"step_finish": {"usage": {"input_tokens": 12, "output_tokens": 4}}},
        {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
    ]
    out = []
    for number, kind in enumerate(kinds, 1):
        event = {"conversation_id": "c", "request_id": "tw-r-1", "sequence_number": number, **kind}
        out.append(json_format.ParseDict({"event": event}, chat_service_pb2.ChatResponse()))
    return out


class Servicer(chat_service_pb2_grpc.ChatServiceServicer):
    """Chat answers a pre-built 4-delta turn: the door's cost alone, without the engine's."""

    def __init__(self) -> None:
        self.events = _events()

    async def Chat(self, request: Any, context: Any) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        for response in self.events:
            yield response

    async def ResumeTurn(
        self, request: Any, context: Any
    ) -> AsyncIterator[chat_service_pb2.ResumeTurnResponse]:
        """The same turn's events, replayed (a retry's read of the stored response)."""
        for response in self.events:
            yield chat_service_pb2.ResumeTurnResponse(event=response.event)


def in_process_door(
    door: Any, interceptors: Sequence[Any] | None = None, token: str = "x"
) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The ASGI app of ``door`` (a ``turnwire_server.http.doors`` factory) over a stub servicer
    whose Chat (and ResumeTurn) answers a pre-built 4-delta turn, and the same Chat through the
    in-process call alone (the baseline: its interceptors, without HTTP). ``interceptors``: the
    calls' interceptors (default: RpcObserver alone; :func:`server_interceptors`: the server's);
    ``token``: the baseline call's bearer token."""
    from turnwire_server.api.rpc_observer import RpcObserver
    from turnwire_server.http.calls import DoorCallInfo, InProcessCalls, MethodTable
    from turnwire_server.http.doors import DoorContext, build_app
    from turnwire_server.http.settings import CorsSettings

    table = MethodTable()
    chat_service_pb2_grpc.add_ChatServiceServicer_to_server(Servicer(), table)  # type: ignore[abstract]
    calls = InProcessCalls(table, [RpcObserver()] if interceptors is None else interceptors)
    service = chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"]
    app = build_app(DoorContext(calls, [service], 4 << 20), [door], CorsSettings())
    chat = request()

    async def direct() -> None:
        metadata = (("authorization", f"Bearer {token}"),)
        async for _ in calls.stream("/turnwire.v1.ChatService/Chat", chat, DoorCallInfo(metadata)):
            pass

    return app, direct


def server_interceptors(workdir: Path) -> tuple[list[Any], str]:
    """The gRPC server's interceptors as ``serve`` installs them with JWT authentication on
    (RpcObserver, AccessInterceptor with a one-key ES256 key set written to ``workdir``, CallGate),
    and a JWT they accept (valid for an hour)."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec
    from jwt.algorithms import ECAlgorithm

    from turnwire_server.access_settings import AuthSettings, JwtSettings
    from turnwire_server.api.access import AccessInterceptor
    from turnwire_server.api.admission import CallGate
    from turnwire_server.api.authentication import Authenticator
    from turnwire_server.api.rpc_observer import RpcObserver

    key = ec.generate_private_key(ec.SECP256R1())
    public = json.loads(ECAlgorithm.to_jwk(key.public_key()))
    public.update(kid="bench", alg="ES256", use="sig")
    jwks = workdir / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public]}), encoding="utf-8")
    settings = AuthSettings(
        enabled=True, jwt=JwtSettings(jwks_file=jwks, issuer="https://bench", audience="turnwire")
    )
    now = int(time.time())
    claims = {"iss": "https://bench", "aud": "turnwire", "sub": "bench", "tenant": "t", "exp": now + 3600}
    token = jwt.encode(claims, key, algorithm="ES256", headers={"kid": "bench"})
    access = AccessInterceptor(Authenticator.from_settings(settings, {}), None)
    return [RpcObserver(), access, CallGate(64)], token


async def against_grpc(
    server: ServerProcess, calls: dict[str, FirstToken], *, rounds: int, turns: int, label: str
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run ``turns`` sequential turns per protocol of ``calls`` (the first is the baseline),
    protocols in turn, ``rounds`` times, after 5 warm-up turns each; returns the times to first
    token (seconds, every turn) and the server CPU per request (seconds, one per round and
    protocol: the sidecar's CPU over the block / ``turns``, the sidecar settled before each block).
    ``label`` names the progress lines on stderr."""
    ttft: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(5):
            await call()
    for number in range(rounds):
        await wait_for_quiet(max_wait=3.0)
        for name, call in calls.items():
            await server.settle()
            cpu0 = server.cpu_seconds()
            for _ in range(turns):
                ttft[name].append(await call())
            cpu[name].append((server.cpu_seconds() - cpu0) / turns)
        print(f"  [{label} round {number + 1}/{rounds} done]", file=sys.stderr, flush=True)
    return ttft, cpu


def comparison_table(title: str, ttft: dict[str, list[float]], cpu: dict[str, list[float]]) -> Table:
    """:func:`against_grpc`'s figures as a table (ms): per protocol, server CPU per request
    (median over rounds) and what it adds to the first protocol's, TTFT p50 and what it adds,
    TTFT p99."""
    table = Table(
        title, ["protocol", "server CPU / request", "added CPU", "TTFT p50", "added TTFT p50", "TTFT p99"]
    )
    base = next(iter(cpu))
    base_cpu = statistics.median(cpu[base])
    base_ttft = percentile(ttft[base], 50)
    for name, blocks in cpu.items():
        own = statistics.median(blocks)
        p50 = percentile(ttft[name], 50)
        table.add(
            name,
            f"{own * 1e3:.2f}",
            "" if name == base else f"{(own - base_cpu) * 1e3:+.2f}",
            f"{p50 * 1e3:.2f}",
            "" if name == base else f"{(p50 - base_ttft) * 1e3:+.2f}",
            f"{percentile(ttft[name], 99) * 1e3:.2f}",
        )
    return table


async def cpu_per_call(one: Callable[[], Awaitable[Any]], requests: int) -> float:
    """This process's CPU (seconds) per ``await one()``: after 200 warm-up calls, the median of
    3 blocks of ``requests`` calls."""
    for _ in range(200):
        await one()
    blocks = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(requests):
            await one()
        blocks.append((time.process_time() - start) / requests)
    return statistics.median(blocks)
