"""The Prometheus endpoint of a real ``turnwire serve``: after scripted turns (a tool call, a
provider error, every turn-running RPC) its scrape, parsed with prometheus-client's own text
parser, counts exactly what happened (docs/operate/metrics.md)."""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from providers.replay import ReplayServer, Reply
from support.sidecar import SidecarError, SidecarFactory, free_port
from support.tokens import auth_config, new_token, write_tokens_file
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, message_pb2

CHAT = "turnwire.v1.ChatService"

CONFIG = {
    "providers": {
        "scripted": {
            "scripts": {
                "weather": [
                    {
                        "text": "Let me check.",
                        "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}],
                        "usage": {"input_tokens": 10, "output_tokens": 5, "cached_input_tokens": 4},
                    },
                    {"text": "It is sunny.", "usage": {"input_tokens": 20, "output_tokens": 3}},
                ],
                "broken": [
                    {"error": {"message": "overloaded, try later", "status": 529, "retryable": True}},
                ],
            }
        }
    },
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``GET /metrics``, by name and labels (parsed by prometheus-client)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_families(port: int) -> list[Metric]:
    """The families of ``GET /metrics`` (parsed by prometheus-client)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return list(text_string_to_metric_families(response.read().decode()))


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` (0 when absent: a counter nobody incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the ``name`` samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)


def grpc_labels(method: str, grpc_type: str = "server_stream", service: str = CHAT) -> Mapping[str, str]:
    return {"grpc_service": service, "grpc_method": method, "grpc_type": grpc_type}


async def test_a_scrape_counts_the_turns_made(sidecar_factory: SidecarFactory) -> None:
    metrics_port = free_port()
    config = {**CONFIG, "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"}}
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        tool_turns = [
            await collect(client.chat(f"m{n}", "weather?", model="scripted:weather")) for n in (1, 2)
        ]
        failed = await collect(client.chat("m3", "hello", model="scripted:broken"))
        note = message_pb2.Message(role=message_pb2.ROLE_USER)
        note.parts.add().text.text = "And tomorrow?"
        saved = await collect(client.save_messages("m1", [note]))  # the demo model
        continued = await collect(client.continue_last_turn("m1"))
        await client.get_conversation("m1")
        with pytest.raises(TurnwireError) as missing:
            await client.get_conversation("no-such-conversation")
        with pytest.raises(TurnwireError) as bad:
            await collect(client.chat("", "no conversation id"))
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [t.status for t in tool_turns] == [event_pb2.TURN_STATUS_COMPLETED] * 2
    assert failed.status == event_pb2.TURN_STATUS_ERROR
    assert saved.status == continued.status == event_pb2.TURN_STATUS_COMPLETED

    # The client sees a call's status before the server's observer counts it as handled, and a
    # turn's end before its metrics land: wait until every call is handled and every turn counted.
    samples = await _scrape_when(metrics_port, _settled(turns=5, handled=8))

    # Turns by entry path and status, and their duration histogram.
    assert value(samples, "turnwire_turns_total", entry="chat", status="completed") == 2
    assert value(samples, "turnwire_turns_total", entry="chat", status="error") == 1
    assert value(samples, "turnwire_turns_total", entry="save_messages", status="completed") == 1
    assert value(samples, "turnwire_turns_total", entry="continue", status="completed") == 1
    assert value(samples, "turnwire_turn_duration_seconds_count", status="completed") == 4
    assert value(samples, "turnwire_turn_duration_seconds_count", status="error") == 1
    assert value(samples, "turnwire_turn_duration_seconds_bucket", status="error", le="+Inf") == 1

    # Steps, tokens (as the turns reported them), time to first token.
    weather = "scripted:weather"
    assert value(samples, "turnwire_steps_total", model=weather, finish_reason="tool-calls") == 2
    assert value(samples, "turnwire_steps_total", model=weather, finish_reason="stop") == 2
    assert value(samples, "turnwire_tokens_total", model=weather, type="input") == sum(
        t.usage.input_tokens for t in tool_turns
    )
    assert value(samples, "turnwire_tokens_total", model=weather, type="output") == sum(
        t.usage.output_tokens for t in tool_turns
    )
    assert value(samples, "turnwire_tokens_total", model=weather, type="cached_input") == 8
    # The tool turns and the two demo turns streamed text; the failed turn never did.
    assert value(samples, "turnwire_time_to_first_token_seconds_count", model=weather) == 2
    assert value(samples, "turnwire_time_to_first_token_seconds_count", model="scripted:demo") == 2
    assert value(samples, "turnwire_time_to_first_token_seconds_count", model="scripted:broken") == 0

    # The tool calls, by outcome, with their duration.
    assert value(samples, "turnwire_tool_calls_total", tool="get_weather", outcome="executed") == 2
    assert value(samples, "turnwire_tool_call_duration_seconds_count", tool="get_weather") == 2

    # The provider error, by its class.
    assert value(samples, "turnwire_provider_errors_total", provider="scripted", reason="overloaded") == 1
    assert total(samples, "turnwire_provider_errors_total") == 1
    assert total(samples, "turnwire_provider_retries_total") == 0  # the scripted model never retries

    # gRPC server metrics by method and code: every call started was handled.
    chat = grpc_labels("Chat")
    assert value(samples, "grpc_server_started_total", **chat) == 4
    assert value(samples, "grpc_server_handled_total", **chat, grpc_code="OK") == 3
    assert value(samples, "grpc_server_handled_total", **chat, grpc_code="InvalidArgument") == 1
    assert value(samples, "grpc_server_handling_seconds_count", **chat) == 4
    for method in ("SaveMessages", "ContinueLastTurn"):
        assert value(samples, "grpc_server_handled_total", **grpc_labels(method), grpc_code="OK") == 1
    get = grpc_labels("GetConversation", "unary")
    assert value(samples, "grpc_server_started_total", **get) == 2
    assert value(samples, "grpc_server_handled_total", **get, grpc_code="OK") == 1
    assert value(samples, "grpc_server_handled_total", **get, grpc_code="NotFound") == 1
    assert value(samples, "grpc_server_handling_seconds_count", **get) == 2
    health = grpc_labels("Check", "unary", "grpc.health.v1.Health")
    assert value(samples, "grpc_server_handled_total", **health, grpc_code="OK") >= 1  # the start-up wait
    assert total(samples, "grpc_server_started_total") == total(samples, "grpc_server_handled_total")

    # Nothing waits or streams any more; the store committed (SQLite's group commits).
    assert value(samples, "turnwire_queued_turns") == 0
    assert total(samples, "turnwire_open_streams") == 0
    assert value(samples, "turnwire_store_commit_duration_seconds_count", backend="sqlite", kind="group") > 0

    # No label holds a conversation or request id.
    ids = {"m1", "m2", "m3", *(t.request_id for t in (*tool_turns, failed, saved, continued))}
    assert not {v for _, labels in samples for _, v in labels} & ids


def _settled(*, turns: int, handled: int) -> Callable[[Samples], bool]:
    """Whether a scrape shows ``turns`` turns counted and at least ``handled`` calls of
    ``ChatService`` handled, every call started handled, nothing streaming or queued."""

    def settled(samples: Samples) -> bool:
        return (
            total(samples, "turnwire_turns_total") == turns
            and total(samples, "grpc_server_handled_total", grpc_service=CHAT) >= handled
            and total(samples, "grpc_server_started_total") == total(samples, "grpc_server_handled_total")
            and total(samples, "turnwire_open_streams") == 0
            and value(samples, "turnwire_queued_turns") == 0
        )

    return settled


async def test_the_endpoint_is_off_unless_enabled(sidecar_factory: SidecarFactory) -> None:
    """By default nothing listens on the metrics port; a ``listen`` without ``enabled`` is warned
    of at start (it stayed off without a word: developer trial)."""
    port = free_port()
    config = {"metrics": {"listen": f"127.0.0.1:{port}"}}
    sidecar = await sidecar_factory(config=config).start()
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(scrape, port)
    assert "metrics is off: metrics.listen is set but metrics.enabled is not" in sidecar.log_text()


async def test_port_zero_logs_the_port_it_got(sidecar_factory: SidecarFactory) -> None:
    """``metrics.listen`` with port 0 (any free port): the start's log names the port bound, which
    serves the scrape (it said ``127.0.0.1:0``, which no scraper can reach)."""
    sidecar = await sidecar_factory(config={"metrics": {"enabled": True, "listen": "127.0.0.1:0"}}).start()
    (port,) = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", sidecar.log_text())
    assert int(port) > 0
    assert any(name.startswith("turnwire_") for name, _ in await asyncio.to_thread(scrape, int(port)))


async def test_a_taken_metrics_port_stops_the_start(sidecar_factory: SidecarFactory) -> None:
    """The endpoint is part of the start: a port already taken ends it with a message naming it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        sidecar = sidecar_factory(config={"metrics": {"enabled": True, "listen": listen}})
        with pytest.raises(SidecarError, match=f"metrics.listen: cannot listen on {listen}"):
            await sidecar.start()
    assert sidecar.returncode == 1


async def test_an_open_stream_and_a_queued_turn_show_in_the_gauges(sidecar_factory: SidecarFactory) -> None:
    """A turn that is still streaming counts as an open stream; one behind it on the same
    conversation as a queued turn; both return to 0 when cancelled. A third call, refused by
    the turn limit before any servicer runs, is counted with its code."""
    metrics_port = free_port()
    held = {"providers": {"scripted": {"scripts": {"held": [{"text": "never sent", "delay_ms": 600_000}]}}}}
    config = {
        **held,
        "limits": {"max_concurrent_rpcs": 2},
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
    }
    sidecar = await sidecar_factory(config=config).start()
    chat = {"grpc_service": CHAT, "grpc_method": "Chat"}
    async with TurnwireClient(sidecar.target) as client:
        first = client.chat("q1", "hold on", model="scripted:held")
        second = client.chat("q1", "and me", model="scripted:held")
        readers = [asyncio.ensure_future(collect(stream)) for stream in (first, second)]
        samples = await _scrape_when(
            metrics_port,
            lambda s: (
                value(s, "turnwire_open_streams", **chat) == 2 and value(s, "turnwire_queued_turns") == 1
            ),
        )
        assert value(samples, "turnwire_queued_turns") == 1
        with pytest.raises(TurnwireError) as refused:
            await collect(client.chat("q2", "one too many"))
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    samples = await _scrape_when(
        metrics_port,
        lambda s: value(s, "turnwire_open_streams", **chat) == 0 and value(s, "turnwire_queued_turns") == 0,
    )
    assert value(samples, "grpc_server_handled_total", **grpc_labels("Chat"), grpc_code="Canceled") == 2
    assert (
        value(samples, "grpc_server_handled_total", **grpc_labels("Chat"), grpc_code="ResourceExhausted") == 1
    )
    assert value(samples, "grpc_server_started_total", **grpc_labels("Chat")) == 3


async def _scrape_when(port: int, condition: Callable[[Samples], bool]) -> Samples:
    """Scrape until ``condition(samples)`` holds (what a call that just ended counts lands within
    the server's next event-loop steps); the last scrape."""
    last: Samples = {}

    async def ready() -> bool:
        nonlocal last
        last = await asyncio.to_thread(scrape, port)
        return condition(last)

    await wait_until(ready, timeout=30, what="the metrics to show the calls made")
    return last


async def test_sdk_retries_and_provider_errors_are_counted(sidecar_factory: SidecarFactory) -> None:
    """An OpenAI-compatible server answers 503 (the SDK retries once), then 401: one retry and
    one ``authentication`` error of that provider."""
    metrics_port = free_port()
    with ReplayServer() as server:
        server.enqueue(
            Reply.error(
                503, {"error": {"message": "busy", "type": "server_error"}}, {"retry-after-ms": "10"}
            ),
            Reply.error(401, {"error": {"message": "bad key", "type": "invalid_request_error"}}),
        )
        config = {
            "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
            "providers": {
                "scripted": {"type": "scripted"},
                "remote": {
                    "type": "openai",
                    "api_key_env": None,
                    "base_url": f"{server.url}/v1",
                    "max_retries": 1,
                },
            },
        }
        sidecar = await sidecar_factory(config=config).start()
        async with TurnwireClient(sidecar.target) as client:
            result = await collect(client.chat("r1", "hello", model="remote:gpt-test"))
        assert result.status == event_pb2.TURN_STATUS_ERROR
        assert len(server.requests) == 2
        samples = await _scrape_when(metrics_port, lambda s: total(s, "turnwire_turns_total") == 1)
        await sidecar.terminate()  # its keep-alive connection would hold the replay server's stop
    assert value(samples, "turnwire_provider_retries_total", provider="remote") == 1
    assert value(samples, "turnwire_provider_errors_total", provider="remote", reason="authentication") == 1


async def test_a_call_refused_without_a_token_counts_under_its_own_method_type(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """A refusal never reads the request, so gRPC runs it as a request stream
    (api/refusal.py); the metrics still label it with the method's own type, also when the
    method's first call is one."""
    metrics_port = free_port()
    tokens = write_tokens_file(tmp_path / "tokens.json", {(token := new_token()): ("p", "t")})
    config = {
        "auth": auth_config(tokens),
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        with pytest.raises(TurnwireError) as refused:
            await collect(client.chat("c", "no token"))
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(TurnwireError):
            await client.get_conversation("c")
    async with TurnwireClient(sidecar.target, token=token) as client:
        assert (await collect(client.chat("c", "hello"))).ok
    samples = await _scrape_when(
        metrics_port,
        lambda s: value(s, "grpc_server_handled_total", **grpc_labels("Chat"), grpc_code="OK") == 1,
    )
    refused_chat = value(
        samples, "grpc_server_handled_total", **grpc_labels("Chat"), grpc_code="Unauthenticated"
    )
    assert refused_chat == 1
    unary = grpc_labels("GetConversation", grpc_type="unary")
    assert value(samples, "grpc_server_handled_total", **unary, grpc_code="Unauthenticated") == 1
    assert total(samples, "grpc_server_started_total", grpc_type="client_stream") == 0
    assert total(samples, "grpc_server_started_total", grpc_type="bidi_stream", grpc_service=CHAT) == 0


METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "operate" / "metrics.md"
SELECTOR = re.compile(r"\b((?:turnwire|grpc_server)_[a-z_]+)(\{[^}]*\})?")
BY = re.compile(r"\bby \(([^)]*)\)\s*\(([^\n]*)")
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def page_queries() -> list[str]:
    """The PromQL lines of the metrics page's ``promql`` block (comments left out)."""
    block = METRICS_PAGE.read_text().split("```promql\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


async def test_the_pages_queries_name_real_families_and_labels(sidecar_factory: SidecarFactory) -> None:
    """Each query of docs/operate/metrics.md, against a scrape after a priced tool turn and a
    failed one: every family it names is exported with that type (``_bucket`` only on a
    histogram) and every label it selects or groups by is one of the family's."""
    metrics_port = free_port()
    config = {
        **CONFIG,
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
        "pricing": {"models": {"scripted:weather": {"input_mtok": 3.0, "output_mtok": 15.0}}},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        await collect(client.chat("q1", "weather?", model="scripted:weather"))
        await collect(client.chat("q2", "hello", model="scripted:broken"))
    await _scrape_when(metrics_port, _settled(turns=2, handled=2))
    families = {f.name: f for f in await asyncio.to_thread(scrape_families, metrics_port)}

    def family_of(series: str) -> tuple[str, str]:
        """The family a series name belongs to, and the suffix it names of it."""
        for suffix in (*HISTOGRAM_SERIES, "_total"):
            base = series.removesuffix(suffix)
            if series.endswith(suffix) and base in families:
                return base, suffix
        assert series in families, f"{series} is not exported: {sorted(families)}"
        return series, ""

    def labels_of(family: str) -> set[str]:
        return {name for sample in families[family].samples for name in sample.labels}

    queries = page_queries()
    assert len(queries) >= 8, queries
    for query in queries:
        named = [(*family_of(m.group(1)), m.group(2) or "") for m in SELECTOR.finditer(query)]
        assert named, query
        for family, suffix, selector in named:
            kind = families[family].type
            if suffix in HISTOGRAM_SERIES:
                assert kind == "histogram", f"{query}: {family} is a {kind}"
            elif suffix == "_total" or kind == "counter":
                assert kind == "counter", f"{query}: {family} is a {kind}"
            selected = set(re.findall(r"(\w+)\s*=", selector))
            assert selected <= labels_of(family), f"{query}: {family} has labels {labels_of(family)}"
        for grouped, inner in BY.findall(query):
            wanted = {label.strip() for label in grouped.split(",")}
            (family, suffix, _), *_ = [(*family_of(m.group(1)), "") for m in SELECTOR.finditer(inner)]
            assert wanted <= labels_of(family), f"{query}: {family} has labels {labels_of(family)}"
