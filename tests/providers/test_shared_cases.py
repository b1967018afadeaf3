"""Every stream in shared/cases/providers/sse, replayed through the official SDK into its adapter,
produces the outcome its ``.expected.json`` gives (text, reasoning, tool calls, finish, usage, error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from providers.helpers import collect, request
from providers.replay import CASES, ReplayServer, Reply
from turnwire import types as base

CASE_NAMES = sorted(path.name.removesuffix(".sse") for path in (CASES / "sse").glob("*.sse"))

# The shared files' normalized names → the engine's finish reasons (same meaning).
FINISH = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "length": "length",
    "refusal": "content-filter",
    "pause_turn": "other",  # not finished: never "stop"
}


def _adapter(name: str) -> str:
    if name.startswith("anthropic_"):
        return "anthropic_provider"
    if name.startswith("openai_responses_"):
        return "responses_provider"
    return "chat_provider"


def test_every_case_is_covered() -> None:
    assert len(CASE_NAMES) >= 12, CASE_NAMES


@pytest.mark.parametrize("name", CASE_NAMES)
async def test_shared_case(name: str, replay: ReplayServer, adapters: dict[str, Any]) -> None:
    case = orjson.loads((CASES / "sse" / f"{name}.expected.json").read_bytes())
    expected = case["expected"]
    provider = adapters[_adapter(name)]
    replay.enqueue(Reply.sse(f"{name}.sse"))

    result = await collect(provider, request())

    assert result.text == expected.get("text", expected.get("text_partial", "")) or (
        expected.get("refusal") and result.text == expected["refusal"]
    )
    if "reasoning" in expected:
        assert result.reasoning == expected["reasoning"]
    if "reasoning_signature" in expected:
        ends = result.of(base.ReasoningEnd)
        assert [e.signature.decode() for e in ends] == [expected["reasoning_signature"]]
    if "reasoning_items" in expected:
        ends = result.of(base.ReasoningEnd)
        assert [e.provider_metadata["openai"]["item_id"] for e in ends] == [
            item["id"] for item in expected["reasoning_items"]
        ]
    _check_calls(result.calls, expected["tool_calls"])
    error = expected.get("error")
    if error is None:
        assert result.error is None, result.error
        finish = result.finish
        assert finish.finish_reason == FINISH[expected["finish_reason"]]
        assert finish.raw_finish_reason == expected["finish_reason_raw"]
        _check_usage(finish.usage, expected.get("usage"))
    else:
        assert result.error is not None, "the stream must fail"
        assert not result.of(base.FinishStep), "a failed stream has no finish"
        assert result.error.status == 0
        if "type" in error:
            assert result.error.type == error["type"]
        if "code" in error:
            assert result.error.code == (error["code"] or "")
        assert result.error.body is not None
        assert "overflow" not in result.error.type
    # must_not: never executed partial tool input, never text made of error JSON.
    assert '"error"' not in result.text


def _check_calls(calls: list[base.ToolCall], expected: list[dict[str, Any]]) -> None:
    assert len(calls) == len(expected)
    for call, want in zip(calls, expected, strict=True):
        assert call.tool_call_id == want.get("id", want.get("call_id"))
        assert call.tool_name == want["name"]
        if want.get("arguments_complete") is False or want.get("arguments") is None:
            assert call.input is None and call.error, "a cut-off call must not be runnable"
            assert call.raw_input == want["arguments_raw"]
        else:
            assert call.input == want["arguments"]
            assert call.error is None
            if "arguments_raw" in want:
                assert call.raw_input == (want["arguments_raw"] or "{}")


def _check_usage(usage: base.Usage, expected: dict[str, Any] | None) -> None:
    if expected is None:
        assert usage == base.Usage()
        return
    cache_read = expected.get("cache_read_input_tokens", expected.get("cached_input_tokens", 0))
    cache_write = expected.get("cache_creation_input_tokens", 0)
    if (
        "cache_read_input_tokens" in expected
        or "server_tool_use" in expected
        or "total_tokens" not in expected
    ):
        # Anthropic: input_tokens excludes cache reads and writes; ours includes them.
        assert usage.input_tokens == expected["input_tokens"] + cache_read + cache_write
    else:
        assert usage.input_tokens == expected["input_tokens"]
    assert usage.output_tokens == expected["output_tokens"]
    assert usage.cached_input_tokens == cache_read
    assert usage.cache_write_input_tokens == cache_write
    assert usage.total_tokens == expected.get("total_tokens", usage.input_tokens + usage.output_tokens)
    assert usage.reasoning_tokens == expected.get("reasoning_tokens", 0)


SHARED = Path(__file__).resolve().parents[3] / "shared" / "cases" / "providers"


def test_the_cases_copy_matches_the_shared_folder() -> None:
    """The repository's copy of the cases equals the planning folder's, where that folder exists.

    CI lays ``shared/`` beside the clone; a plain clone has no such folder, so the test is
    skipped there (reported with its reason), never counted as a pass.
    """
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (the planning folder ../shared is not beside this clone)")
    shared = {p.relative_to(SHARED): p.read_bytes() for p in SHARED.rglob("*") if p.is_file()}
    copied = {p.relative_to(CASES): p.read_bytes() for p in CASES.rglob("*") if p.is_file()}
    assert copied == shared, "tests/providers/cases differs from shared/cases/providers: copy it again"
