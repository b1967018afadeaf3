"""Where the sidecar puts Anthropic's cache breakpoints (providers/prompt_cache.py): the end of
the conversation, the system prompt, the tools, in that order, within the API's four, after the
request's own; never on a thinking block or an empty text; never into a shared conversion."""

from __future__ import annotations

import copy
from typing import Any

from turnwire_server.providers.prompt_cache import place_breakpoints

EPHEMERAL = {"type": "ephemeral"}


def _kwargs(**fields: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 100,
        "system": "Be brief.",
        "tools": [{"name": "a", "input_schema": {}}, {"name": "b", "input_schema": {}}],
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": [{"type": "text", "text": "answer"}]},
            {"role": "user", "content": "second"},
        ],
        **fields,
    }


def test_three_breakpoints_end_of_conversation_system_and_tools() -> None:
    kwargs = _kwargs()
    shared = kwargs["messages"]
    before = copy.deepcopy(shared)
    assert place_breakpoints(kwargs, "5m") == 3
    assert kwargs["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "second", "cache_control": EPHEMERAL}],
    }
    assert kwargs["messages"][:2] == before[:2]
    assert kwargs["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert kwargs["tools"][-1] == {"name": "b", "input_schema": {}, "cache_control": EPHEMERAL}
    assert "cache_control" not in kwargs["tools"][0]
    assert shared == before, "the converted messages, shared with other requests, are unchanged"


def test_an_hour_long_cache_says_its_ttl() -> None:
    kwargs = _kwargs()
    place_breakpoints(kwargs, "1h")
    assert kwargs["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_the_requests_own_markers_count_against_the_four() -> None:
    marked = {"type": "ephemeral"}
    kwargs = _kwargs(
        system=[
            {"type": "text", "text": "a", "cache_control": marked},
            {"type": "text", "text": "b", "cache_control": marked},
        ],
        tools=[{"name": "a", "input_schema": {}, "cache_control": marked}],
    )
    assert place_breakpoints(kwargs, "5m") == 1  # four in all: the end of the conversation only
    assert kwargs["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL
    assert kwargs["tools"] == [{"name": "a", "input_schema": {}, "cache_control": marked}]


def test_a_top_level_cache_control_marks_the_last_block_itself() -> None:
    kwargs = _kwargs(cache_control=EPHEMERAL)
    assert place_breakpoints(kwargs, "5m") == 2
    assert kwargs["messages"][-1]["content"] == "second"


def test_thinking_and_empty_text_blocks_are_passed_over() -> None:
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    kwargs = _kwargs(
        system="",
        tools=[],
        messages=[
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "partial"}, thinking, {"type": "text", "text": ""}],
            },
        ],
    )
    assert place_breakpoints(kwargs, "5m") == 1
    content = kwargs["messages"][-1]["content"]
    assert content[0]["cache_control"] == EPHEMERAL
    assert "cache_control" not in content[1] and "cache_control" not in content[2]
    assert kwargs["system"] == "" and kwargs["tools"] == []
