"""Secrets never reach a client (issue 32, item 1): a provider error that quotes the API key (a
proxy answering 401 "Incorrect API key provided: <key>") and a tool error that quotes a configured
secret are masked where they enter the sidecar, so the client's ``TurnEnd.error``, the stored turn
(``GetConversation``), a ``ResumeTurn`` replay, the exported spans and the log all carry ``***``.

A real ``turnwire serve`` calls a replay server through the official ``openai`` SDK
(``tests/providers/replay.py``).
"""

from __future__ import annotations

from pathlib import Path

from providers.replay import ReplayServer, Reply
from support.hooks import pythonpath_env
from support.otlp_receiver import otlp_receiver
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2

# The shape of an OpenAI project key (https://platform.openai.com/docs/api-reference/authentication).
API_KEY = "sk-proj-Zq8RkT2vLx9NwB4cY7uJm3HsPd6Fg1Ae5Ki0Oo"
TOOL_KEY = "tool-upstream-key-7f3c91d2"  # not a key shape: masked because the config names it
HEADER_VALUE = "hdr-secret-value-4b8e"  # a default header's value, never quoted whole by the SDK


def _config(replay: ReplayServer, endpoint: str) -> dict[str, object]:
    return {
        "default_model": "wire:gpt-test",
        "providers": {
            "wire": {
                "type": "openai",
                "base_url": f"{replay.url}/v1",
                "api_key_env": "WIRE_KEY",
                "max_retries": 0,
                "default_headers": {"x-proxy-token": HEADER_VALUE},
            },
            "scripted": {
                "scripts": {"fetch": [{"tool_calls": [{"name": "fetch", "input": {"url": "https://up"}}]}]}
            },
        },
        "tools": {"python": ["support.leaky_tools:fetch"]},
        # The tool's upstream key is a configured secret (an export header here); the spans hold
        # message content, tool errors included.
        "tracing": {
            "enabled": True,
            "endpoint": endpoint,
            "headers": {"x-upstream": TOOL_KEY},
            "capture_message_content": True,
        },
    }


async def test_a_provider_error_quoting_the_key_is_masked_on_every_path(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    replay = ReplayServer().start()
    try:
        async with otlp_receiver() as receiver:
            config = _config(replay, receiver.endpoint)
            env = {
                **pythonpath_env(),
                "WIRE_KEY": API_KEY,
                "LEAKY_TOOL_KEY": TOOL_KEY,
                "OTEL_BSP_SCHEDULE_DELAY": "50",
                "TURNWIRE_LOG_LEVEL": "debug",
            }
            sidecar = await sidecar_factory(config=config, env=env).start()
            # A proxy that echoes the whole key (OpenAI itself shows only its last four characters).
            body = {
                "error": {
                    "message": f"Incorrect API key provided: {API_KEY}. You can find your API key at "
                    "https://platform.openai.com/account/api-keys.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
            replay.enqueue(Reply.error(401, body))
            async with TurnwireClient(sidecar.target) as client:
                failed = await collect(client.chat("leak", "hello", request_id="r-key"))
                assert failed.status == event_pb2.TURN_STATUS_ERROR
                assert failed.error is not None
                assert "Incorrect API key provided: ***." in failed.error.message, failed.error.message
                stored = await client.get_conversation("leak")
                replayed = await collect(client.resume_turn("r-key"))
                tool_turn = await collect(client.chat("leak-tool", "fetch it", model="scripted:fetch"))
                tool_stored = await client.get_conversation("leak-tool")
            await wait_until(lambda: receiver.named("chat gpt-test"), what="the failed step's span")
            await wait_until(lambda: receiver.named("execute_tool fetch"), what="the tool's span")
            await sidecar.terminate()
    finally:
        replay.stop()

    client_texts = [
        str(failed.error),
        str(stored),
        str(replayed.events),
        str(tool_turn.events),
        str(tool_stored),
    ]
    span_texts = [str(span.span) for span in receiver.spans]
    log = sidecar.log_text()
    for secret in (API_KEY, TOOL_KEY, HEADER_VALUE):
        for text in (*client_texts, *span_texts, log):
            assert secret not in text
    # The stored turn and its replay carry the masked error, not a second version of it.
    assert replayed.error is not None and replayed.error.message == failed.error.message
    turns = [turn for turn in stored.turns_without_reply] + [reply for reply in stored.partial_replies]
    assert any("Incorrect API key provided: ***." in str(turn) for turn in turns), stored
    # The tool's error reached the model and the client masked, keeping its wording.
    calls = [p.tool_call for m in tool_stored.messages for p in m.parts if p.HasField("tool_call")]
    assert calls
    for call in calls:
        assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
        assert (
            call.error_text
            == "GET https://up: 401 Incorrect API key provided: ***. Authorization: Bearer ***"
        )
    [chat_span] = receiver.named("chat gpt-test")
    assert "Incorrect API key provided: ***." in chat_span.span.status.message
    assert any(
        "Incorrect API key provided: ***." in str(span.span) for span in receiver.named("execute_tool fetch")
    )


async def test_a_hooks_error_quoting_a_secret_is_masked_on_every_path(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """Fresh-user trial (stop 65): a hook's error text reached the client and the stored turn
    unmasked (the log alone was masked), with the sidecar's own class path for a remote hook. A
    hook's error is text from outside the engine too: masked where it enters (the hook chain), so
    the client's ``TurnEnd.error``, the stored turn, its replay and the spans carry ``***``."""
    async with otlp_receiver() as receiver:
        config = {
            "middleware": [{"path": "support.leaky_tools:LeakyPolicy"}],
            "tracing": {"enabled": True, "endpoint": receiver.endpoint, "headers": {"x-upstream": TOOL_KEY}},
        }
        env = {**pythonpath_env(), "LEAKY_TOOL_KEY": TOOL_KEY, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        sidecar = await sidecar_factory(config=config, env=env).start()
        async with TurnwireClient(sidecar.target) as client:
            failed = await collect(
                client.chat("hook-leak", "hello", request_id="r-hook", body={"leak": True})
            )
            assert failed.status == event_pb2.TURN_STATUS_ERROR
            assert failed.error is not None
            assert failed.error.message == (
                "policy db refused: password=***, api_key=*** (RuntimeError in middleware "
                "support.leaky_tools:LeakyPolicy, before_turn)"
            ), failed.error.message
            stored = await client.get_conversation("hook-leak")
            replayed = await collect(client.resume_turn("r-hook"))
        await wait_until(lambda: receiver.named("before_turn LeakyPolicy"), what="the hook's span")
        await sidecar.terminate()
    assert replayed.error is not None and replayed.error.message == failed.error.message
    texts = [str(failed.error), str(stored), str(replayed.events), *(str(s.span) for s in receiver.spans)]
    texts.append(sidecar.log_text())
    for text in texts:
        assert TOOL_KEY not in text and "hunter2-db-pass" not in text
    [hook_span] = receiver.named("before_turn LeakyPolicy")
    assert "password=***" in hook_span.span.status.message
