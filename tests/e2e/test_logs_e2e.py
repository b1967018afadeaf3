"""What a real ``turnwire serve`` logs (docs/operate/logs.md): JSON lines that carry the
conversation and request ids, and never a secret of the configuration, even at DEBUG, even when
a provider quotes the key back in its error."""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from providers.helpers import a_text_stream
from providers.replay import ReplayServer, Reply
from support.sidecar import SidecarFactory
from support.stores import postgres_database
from support.tokens import auth_config, new_token, write_tokens_file

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

GRPC_CORE_LINE = re.compile(r"^[IWEF]\d{4} ")
"""A line gRPC's C core writes itself (absl format), not through Python's logging."""

SCRIPTS = {
    "weather": [
        {"text": "Let me check.", "tool_calls": [{"name": "get_weather", "input": {"city": "Oslo"}}]},
        {"text": "It is cold."},
    ],
    "broken": [{"error": {"message": "overloaded, try later", "status": 529, "retryable": True}}],
}


def json_lines(log: str) -> list[dict[str, Any]]:
    """Every line of ``log`` as JSON; fails on a line that is neither JSON nor gRPC core's."""
    records = []
    for line in log.splitlines():
        if not line.strip() or GRPC_CORE_LINE.match(line):
            continue
        record = json.loads(line)  # a line that is not JSON fails the test here
        assert isinstance(record, dict), line
        records.append(record)
    return records


async def test_json_lines_carry_the_conversation_and_request_ids(sidecar_factory: SidecarFactory) -> None:
    config = {
        "logging": {"format": "json", "level": "debug"},
        "providers": {"scripted": {"scripts": SCRIPTS}},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        done = await collect(client.chat("log-1", "weather?", model="scripted:weather", request_id="req-ok"))
        failed = await collect(client.chat("log-2", "hi", model="scripted:broken", request_id="req-broken"))
    assert done.status == event_pb2.TURN_STATUS_COMPLETED
    assert failed.status == event_pb2.TURN_STATUS_ERROR
    assert await sidecar.terminate() == 0

    records = json_lines(sidecar.log_text())
    assert records, sidecar.log_text()
    for record in records:
        assert {"timestamp", "level", "logger", "message"} <= record.keys(), record
    turn_ends = {r["request_id"]: r for r in records if r["message"].startswith("turn ended")}
    assert turn_ends.keys() == {"req-ok", "req-broken"}
    assert turn_ends["req-ok"]["conversation_id"] == "log-1"
    assert turn_ends["req-broken"]["conversation_id"] == "log-2"
    failure = next(r for r in records if r.get("event") == "chat:request:failed")
    assert (failure["conversation_id"], failure["request_id"]) == ("log-2", "req-broken")
    assert failure["level"] == "WARNING" and failure["classification"] == "transient"
    # Lines outside any call or turn carry no ids at all (not empty ones).
    listening = next(r for r in records if r["message"].startswith("turnwire listening"))
    assert "conversation_id" not in listening and "request_id" not in listening


@pytest.fixture
def provider() -> Iterator[ReplayServer]:
    """An OpenAI-compatible server that refuses the key and quotes it back, as some do."""
    with ReplayServer() as server:
        yield server


@pytest.fixture
def mcp() -> Iterator[ReplayServer]:
    """An HTTP "MCP server" that answers nothing useful (it only records the headers it got)."""
    with ReplayServer() as server:
        yield server


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or "postgres"
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.parametrize("log_format", ["json", "text"])
async def test_no_log_line_holds_a_secret(
    sidecar_factory: SidecarFactory, provider: ReplayServer, mcp: ReplayServer, log_format: str
) -> None:
    """At DEBUG, with a PostgreSQL password in the store URL, a provider key the provider quotes
    back in its 401, and a bearer token in an MCP server's headers: none appears in the log."""
    api_key = f"sk-leaktest-{secrets.token_hex(12)}"
    token = f"tok-leaktest-{secrets.token_hex(12)}"
    quoted = f"Incorrect API key provided: {api_key}. Sent: Authorization: Bearer {api_key}"
    provider.enqueue(
        Reply.error(
            401, {"error": {"message": quoted, "type": "invalid_request_error", "code": "invalid_api_key"}}
        )
    )
    with postgres_database() as database:
        # The server's own password when its URL has one (else trust auth ignores this one).
        password = urlsplit(database).password or os.environ.get("PGPASSWORD") or f"pw-{secrets.token_hex(8)}"
        store_url = _with_password(database, password)
        config = {
            "logging": {"level": "debug", "format": log_format},
            "providers": {
                "scripted": {"type": "scripted"},
                "leaky": {
                    "type": "openai",
                    "api_key_env": "LEAK_TEST_KEY",
                    "base_url": f"{provider.url}/v1",
                    "max_retries": 0,
                },
            },
            "tools": {
                "mcp": [
                    {
                        "name": "search",
                        "url": f"{mcp.url}/mcp",
                        "headers": {"Authorization": f"Bearer {token}"},
                        "startup_timeout_seconds": 2,
                    }
                ]
            },
        }
        sidecar = sidecar_factory(config=config, env={"LEAK_TEST_KEY": api_key}, store_url=store_url)
        await sidecar.start()
        async with TurnwireClient(sidecar.target) as client:
            result = await collect(client.chat("leak-1", "hello", model="leaky:gpt-test"))
        assert await sidecar.terminate() == 0
    log = sidecar.log_text()

    # The secrets were really used: the key and the token went out, the turn failed on the 401.
    assert result.status == event_pb2.TURN_STATUS_ERROR
    assert provider.requests and provider.requests[0].headers["authorization"] == f"Bearer {api_key}"
    assert any(r.headers.get("authorization") == f"Bearer {token}" for r in mcp.requests)
    assert "chat request failed" in log and "Incorrect API key provided: ***" in log, log
    for secret in (api_key, token, password):
        assert secret not in log, f"{secret!r} was logged:\n{log}"
    if log_format == "json":
        json_lines(log)


@pytest.mark.parametrize("log_format", ["json", "text"])
async def test_debug_lines_hold_no_conversation_content(
    sidecar_factory: SidecarFactory, provider: ReplayServer, log_format: str
) -> None:
    """At DEBUG the Anthropic SDK logs each request's options; before, with the body in them
    (``'content': b'{"messages": [… the user's text …]'``): every prompt, the system prompt and
    the whole history landed in the log of an operator who turned DEBUG on to look at a failure,
    although message content reaches spans only with ``capture_message_content``. The line stays,
    without its body."""
    prompt = f"my card is {secrets.token_hex(8)}"
    system = f"house rules {secrets.token_hex(8)}"
    provider.enqueue(Reply.sse(a_text_stream("Noted.")))
    config = {
        "logging": {"level": "debug", "format": log_format},
        "system_prompt": system,
        "default_model": "anthropic:claude-test",
        "providers": {
            "anthropic": {
                "type": "anthropic",
                "api_key_env": "LOG_TEST_A_KEY",
                "base_url": provider.url,
                "max_retries": 0,
            }
        },
    }
    sidecar = sidecar_factory(config=config, env={"LOG_TEST_A_KEY": "sk-ant-log-test"})
    await sidecar.start()
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("content-1", prompt))
    assert await sidecar.terminate() == 0
    log = sidecar.log_text()

    assert result.status == event_pb2.TURN_STATUS_COMPLETED and result.text == "Noted."
    assert prompt in provider.requests[0].body.decode()  # the text really went out
    options = [line for line in log.splitlines() if "Request options" in line]
    assert options and all("/v1/messages" in line and "omitted" in line for line in options), log
    for content in (prompt, system):
        assert content not in log, f"{content!r} was logged:\n{log}"
    if log_format == "json":
        json_lines(log)


async def test_a_calls_lines_name_its_tenants_conversation(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """Two tenants use the same conversation id and both hang up a turn. A turn's lines name its
    ids as store keys (``acme/same``, docs/operate/authentication.md); before, the lines of the
    call around it (gRPC's own cancel line, a store error while reading) named the client's bare
    ``same``: a log search by the turn's conversation_id missed them, and one by ``same`` mixed
    the two tenants' calls."""
    acme, globex = new_token(), new_token()
    tokens = write_tokens_file(
        tmp_path / "tokens.yaml", {acme: ("app-a", "acme"), globex: ("app-g", "globex")}
    )
    slow = {"slow": [{"text": " ".join(f"w{n}" for n in range(200)), "delay_ms": 20}]}
    config = {
        "logging": {"level": "debug", "format": "json"},
        "providers": {"scripted": {"scripts": slow}},
        "auth": auth_config(tokens),
    }
    sidecar = await sidecar_factory(config=config).start()
    for token in (acme, globex):
        async with TurnwireClient(sidecar.target, token=token) as client:
            async for event in client.chat("same", "go", model="scripted:slow"):
                if event.HasField("text_delta"):
                    break  # the client hangs up
    assert await sidecar.terminate() == 0

    records = json_lines(sidecar.log_text())
    named = {(r["logger"], r["conversation_id"]) for r in records if "conversation_id" in r}
    assert ("grpc._cython.cygrpc", "acme/same") in named and ("grpc._cython.cygrpc", "globex/same") in named
    assert {conversation for _, conversation in named} == {"acme/same", "globex/same"}, named


async def test_json_lines_name_the_replica(sidecar_factory: SidecarFactory) -> None:
    """``--workers`` writes its workers' lines to one stderr, and replicas' logs are read side
    by side: before, no field said which replica wrote a line (which one recovered a turn, which
    one lost its store). JSON lines carry ``replica_id``, the id the start-up line, the spans'
    ``service.instance.id`` and the store's sessions name."""
    config = {
        "logging": {"format": "json", "level": "debug"},
        "providers": {"scripted": {"scripts": SCRIPTS}},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        await collect(client.chat("rep-1", "weather?", model="scripted:weather", request_id="req-rep"))
    assert await sidecar.terminate() == 0
    records = json_lines(sidecar.log_text())
    listening = next(r for r in records if r["message"].startswith("turnwire listening"))
    replica = re.search(r"replica (replica-[0-9a-f]{12})", listening["message"])
    assert replica is not None, listening
    turn_lines = [r for r in records if r.get("request_id") == "req-rep"]
    assert turn_lines and all(r.get("replica_id") == replica.group(1) for r in turn_lines), turn_lines
    assert listening["replica_id"] == replica.group(1)
