"""The compaction building blocks (docs/semantics.md §9): the strategies, the view a stored
compaction makes, the token estimate, the ``ContextCompaction`` middleware's options and how
``configure_session`` results merge. The engine's use of them is ``test_compaction.py``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pytest

from turnwire.compaction import (
    ELIDED_OUTPUT,
    CompactionConfig,
    CompactionContext,
    DropOldestToolOutputs,
    EstimateTokens,
    SummarizeOlder,
    _SchemaChars,
    elide_outputs,
    message_bytes,
)
from turnwire.hooks import Middleware, SessionConfig, SessionContext
from turnwire.middlewares import ContextCompaction
from turnwire.providers import ModelRequest, ProviderError
from turnwire.testing import overflow_error
from turnwire.types import ToolDefinition
from turnwire.values import loads, tool_call_output_json, value_view
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.compaction import apply_compaction, input_start
from turnwire_server.engine.ids import assistant_message_id, attempt_message_id
from turnwire_server.hooks.chain import HookError, MiddlewareChain
from turnwire_server.providers.convert import tool_result
from turnwire_server.store.records import CompactionRecord

USER, ASSISTANT = message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT
ESTIMATE = EstimateTokens()


def text(
    message_id: str, role: message_pb2.Role.ValueType, value: str = "words " * 50
) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = value
    return message


def with_calls(message_id: str, *steps: Sequence[str]) -> message_pb2.Message:
    """An assistant message whose steps call ``lookup`` with the given call ids (big outputs)."""
    message = message_pb2.Message(id=message_id, role=ASSISTANT)
    for calls in steps:
        message.parts.add().step_start.SetInParent()
        for call_id in calls:
            call = message.parts.add().tool_call
            call.tool_call_id, call.tool_name, call.input_json = call_id, "lookup", "{}"
            call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
            call.output_json = '"' + "data " * 200 + '"'
    return message


def outputs(message: message_pb2.Message) -> dict[str, str]:
    return {
        p.tool_call.tool_call_id: p.tool_call.output_json for p in message.parts if p.HasField("tool_call")
    }


def context(
    messages: Sequence[message_pb2.Message],
    *,
    keep_from: int | None = None,
    current: message_pb2.Message | None = None,
    target: int | None = None,
    summaries: list[Sequence[message_pb2.Message]] | None = None,
    fits: int | None = None,
) -> CompactionContext:
    """A context whose summarizer records what it was sent and, with ``fits``, overflows like a
    model with a window of that many tokens."""

    async def summarize(instructions: str, batch: Sequence[message_pb2.Message]) -> str:
        if fits is not None and ESTIMATE.messages(batch) > fits:
            raise overflow_error(ESTIMATE.messages(batch), fits)
        if summaries is not None:
            summaries.append(list(batch))
        return f"summary of {len(batch)}"

    return CompactionContext(
        messages=list(messages),
        current=current,
        keep_from=len(messages) - 1 if keep_from is None else keep_from,
        tokens=ESTIMATE.messages,
        target_tokens=target,
        summarize=summarize,
    )


HISTORY = [
    text("u0", USER),
    text("a0", ASSISTANT),
    text("u1", USER),
    with_calls("a1", ["c1"]),
    text("u2", USER),
    text("a2", ASSISTANT),
    text("u3", USER),
]


# --------------------------------------------------------------------------- SummarizeOlder


async def test_summarize_older_replaces_everything_before_the_kept_exchanges_by_one_summary() -> None:
    sent: list[Sequence[message_pb2.Message]] = []
    result = await SummarizeOlder(keep_recent_exchanges=2).compact(context(HISTORY, summaries=sent))
    assert result.replaced == 4  # u0 a0 u1 a1; the tail starts at the exchange of u2
    assert [m.id for m in sent[0]] == ["u0", "a0", "u1", "a1"]
    assert result.summary is not None and result.summary.role == USER and result.summary.id == "tw-c-a1"
    assert result.summary.parts[0].text.text == "Summary of the earlier conversation:\nsummary of 4"


async def test_summarize_older_never_touches_this_turns_input_and_says_when_it_cannot_shorten() -> None:
    # Only this turn's input: nothing older to summarize.
    assert (await SummarizeOlder().compact(context([text("u0", USER)]))).empty
    # A previous summary and this turn's input, with no exchange between: nothing to cut.
    assert (await SummarizeOlder().compact(context([text("tw-c-a9", USER), text("u", USER)]))).empty
    # A continuation (keep_from at the last message, an assistant reply): the reply stays.
    result = await SummarizeOlder().compact(context(HISTORY[:6], keep_from=5))
    assert result.replaced == 4


async def test_a_summary_request_that_overflows_is_made_in_parts_that_fit() -> None:
    sent: list[Sequence[message_pb2.Message]] = []
    fits = ESTIMATE.messages(HISTORY[3:4]) + 20  # the largest message fits, the history does not
    result = await SummarizeOlder().compact(context(HISTORY, summaries=sent, fits=fits))
    assert result.replaced == 6
    assert all(ESTIMATE.messages(batch) <= fits for batch in sent)
    covered = [m.id for batch in sent for m in batch if not m.id.startswith("tw-c-")]
    assert sorted(covered) == sorted(m.id for m in HISTORY[:6])  # every message, once


async def test_a_summary_that_fails_for_another_reason_fails_the_compaction() -> None:
    async def broken(instructions: str, batch: Sequence[message_pb2.Message]) -> str:
        raise ProviderError("unauthorized", status=401, type="authentication_error")

    ctx = context(HISTORY)
    with pytest.raises(ProviderError):
        await SummarizeOlder().compact(
            CompactionContext(ctx.messages, None, ctx.keep_from, ctx.tokens, None, broken)
        )


# --------------------------------------------------------------------------- DropOldestToolOutputs


async def test_drop_oldest_tool_outputs_goes_oldest_first_and_stops_once_it_fits() -> None:
    history = [text("u0", USER), with_calls("a0", ["c0", "c1"]), text("u1", USER), with_calls("a1", ["c2"])]
    history.append(text("u2", USER))
    full = ESTIMATE.messages(history)
    one_output = full - ESTIMATE.messages(
        [*history[:1], elide_outputs(history[1], frozenset({("a0", "c0")})), *history[2:]]
    )
    result = await DropOldestToolOutputs().compact(context(history, target=full - one_output))
    assert result.elided_calls == {("a0", "c0")} and result.replaced == 0
    everything = await DropOldestToolOutputs().compact(context(history, target=1))
    assert everything.elided_calls == {("a0", "c0"), ("a0", "c1"), ("a1", "c2")}


async def test_drop_oldest_tool_outputs_keeps_the_last_steps_of_this_turn() -> None:
    current = with_calls("reply", ["s0"], ["s1"], ["s2"])
    result = await DropOldestToolOutputs(keep_recent_steps=1).compact(
        context([text("u0", USER)], keep_from=0, current=current, target=1)
    )
    assert result.elided_calls == {("reply", "s0"), ("reply", "s1")}
    shown = elide_outputs(current, result.elided_calls)
    assert outputs(shown)["s2"] == outputs(current)["s2"]
    assert outputs(shown)["s0"] == '"' + ELIDED_OUTPUT.format(size=len(outputs(current)["s0"])) + '"'
    assert outputs(current)["s0"].startswith('"data')  # the original is untouched
    # A dropped output is not dropped twice.
    again = await DropOldestToolOutputs().compact(context([shown], keep_from=0, target=1))
    assert again.elided_calls == {("reply", "s2")}


def _old_field(message: message_pb2.Message) -> message_pb2.Message:
    """``message`` with every output moved to the deprecated ``output`` Value, as a client writes it
    through AddMessages without ``output_json``."""
    copy = message_pb2.Message()
    copy.CopyFrom(message)
    for part in copy.parts:
        if part.HasField("tool_call"):
            view = value_view(loads(part.tool_call.output_json))
            assert view is not None
            part.tool_call.output.CopyFrom(view)
            part.tool_call.ClearField("output_json")
    return copy


async def test_an_output_only_in_the_deprecated_field_is_counted_dropped_and_cut_the_same() -> None:
    """One accessor (``tool_call_output_json``) for the output everywhere (docs/semantics.md §11):
    the adapters send the ``output`` Value, so compaction must size it, drop it and shorten it too."""
    new = with_calls("a0", ["c0"])
    old = _old_field(new)
    assert not old.parts[1].tool_call.output_json and old.parts[1].tool_call.HasField("output")
    assert tool_call_output_json(old.parts[1].tool_call) == tool_call_output_json(new.parts[1].tool_call)
    assert message_bytes(old) == message_bytes(new)
    history = [text("u0", USER), old, text("u1", USER)]
    result = await DropOldestToolOutputs().compact(context(history, target=1))
    assert result.elided_calls == {("a0", "c0")}
    shown = elide_outputs(old, result.elided_calls)
    call = shown.parts[1].tool_call
    assert not call.HasField("output") and "omitted to fit the context window" in call.output_json
    assert tool_result(call) == (ELIDED_OUTPUT.format(size=len(outputs(new)["c0"])), False)
    # A summary request cuts the longest part, the old-field output included.
    huge = _old_field(with_calls("a1", ["c1"]))
    huge.parts[1].tool_call.output.string_value = "start " + "middle " * 2000 + "end"
    sent: list[Sequence[message_pb2.Message]] = []
    await SummarizeOlder().compact(
        context([text("u0", USER), huge, text("u1", USER)], summaries=sent, fits=200)
    )
    cut = [m for batch in sent for m in batch if m.id == "a1"][-1].parts[1].tool_call
    assert "characters cut to fit the summary request" in loads(tool_call_output_json(cut))


def test_elided_outputs_name_the_message_too_as_a_call_id_may_repeat_across_turns() -> None:
    first, second = with_calls("a0", ["call_0_0"]), with_calls("a1", ["call_0_0"])
    elided = frozenset({("a0", "call_0_0")})
    assert elide_outputs(first, elided) is not first
    assert elide_outputs(second, elided) is second


# --------------------------------------------------------------------------- the stored view


def test_a_stored_compaction_makes_the_view_and_an_edited_history_falls_back_to_the_messages() -> None:
    summary = text("tw-c-a1", USER, "Summary: earlier talk")
    record = CompactionRecord(
        "conv", "a1", summary, (("a1", "c1"),), "reactive", "summarize", 100, 10, dt.datetime.now(dt.UTC)
    )
    assert [m.id for m in apply_compaction(HISTORY, record)] == ["tw-c-a1", "u2", "a2", "u3"]
    assert apply_compaction(HISTORY, None) == HISTORY
    # The summarized messages were replaced by other ones (AddMessages): the model sees them whole,
    # with the dropped outputs still dropped.
    edited = [m for m in HISTORY if m.id != "a1"]
    assert [m.id for m in apply_compaction(edited, record)] == [m.id for m in edited]
    no_summary = CompactionRecord(
        "conv", "", None, (("a1", "c1"),), "threshold", "drop", 1, 1, record.create_time
    )
    view = apply_compaction(HISTORY, no_summary)
    assert "omitted" in outputs(view[3])["c1"] and view[3] is not HISTORY[3]
    assert input_start(view, ["u3"]) == 6 and input_start(view, []) == 6


# --------------------------------------------------------------------------- configuration


def test_context_compaction_options_build_the_config_and_bad_ones_name_the_option() -> None:
    middleware = ContextCompaction(
        strategy="drop_tool_outputs", reactive=True, proactive=True, max_input_tokens=1000, headroom=0.8
    )
    config = middleware.config
    assert isinstance(config.strategy, DropOldestToolOutputs) and config.guard_tokens == 800
    with pytest.raises(ValueError, match="headroom"):
        ContextCompaction(headroom=1.5)
    with pytest.raises(ValueError, match="strategy"):
        ContextCompaction(strategy="magic")
    with pytest.raises(ValueError, match="unknown_option"):
        ContextCompaction(unknown_option=1)
    with pytest.raises(ValueError, match="max_input_tokens"):
        ContextCompaction(proactive=True)


class _Session(Middleware):
    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result

    async def configure_session(self, ctx: SessionContext) -> Any:
        return self.result


async def test_configure_session_results_merge_and_a_wrong_return_is_a_clear_error() -> None:
    ctx = SessionContext(default_model="scripted:demo", system="s", tools={})
    first, second = CompactionConfig(reactive=True), CompactionConfig(compact_after=10)
    merged = await MiddlewareChain(
        [_Session(SessionConfig(first)), _Session(None), _Session(SessionConfig(second))]
    ).configure_session(ctx)
    assert merged.compaction is second
    assert (await MiddlewareChain([]).configure_session(ctx)).compaction is None
    with pytest.raises(HookError, match="not SessionConfig"):
        await MiddlewareChain([_Session({"compaction": True})]).configure_session(ctx)


def test_each_attempt_of_a_turn_run_again_has_its_own_reply_id() -> None:
    assert attempt_message_id("r1", 1) == assistant_message_id("r1") == "tw-a-r1"
    assert attempt_message_id("r1", 2) == "tw-a2-r1"
    long_id = "r" * 125
    assert len(attempt_message_id(long_id, 3)) <= 128
    assert attempt_message_id(long_id, 3) != attempt_message_id(long_id + "x", 3)


async def test_drop_oldest_tool_outputs_leaves_outputs_too_short_to_gain_from_it() -> None:
    small = message_pb2.Message(id="a0", role=ASSISTANT)
    call = small.parts.add().tool_call
    call.tool_call_id, call.tool_name, call.output_json = "tiny", "lookup", '{"ok":true}'
    call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    history = [text("u0", USER), small, text("u1", USER), with_calls("a1", ["big"]), text("u2", USER)]
    result = await DropOldestToolOutputs().compact(context(history, target=1))
    assert result.elided_calls == {("a1", "big")}


async def test_one_message_larger_than_the_summary_window_is_summarized_from_a_shortened_copy() -> None:
    sent: list[Sequence[message_pb2.Message]] = []
    huge = text("u0", USER, "start " + "middle " * 2000 + "end")
    fits = 200
    result = await SummarizeOlder().compact(
        context([huge, text("a0", ASSISTANT), text("u1", USER)], summaries=sent, fits=fits)
    )
    assert result.replaced == 2
    shortened = [m for batch in sent for m in batch if m.id == "u0"]
    assert shortened and all(
        "characters cut to fit the summary request" in m.parts[0].text.text for m in shortened
    )
    assert shortened[-1].parts[0].text.text.startswith("start ") and shortened[-1].parts[
        0
    ].text.text.endswith("end")


async def test_context_compaction_says_what_to_fix(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(
        ValueError, match=r"overflow_retry: unknown option; did you mean overflow_retries\? valid options: "
    ):
        ContextCompaction(overflow_retry=3)
    ctx = SessionContext(default_model="scripted:demo", system="s", tools={})
    with caplog.at_level("WARNING", logger="turnwire.compaction"):
        await ContextCompaction().configure_session(ctx)
    assert "all off, so nothing is ever compacted; set reactive: true" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="turnwire.compaction"):
        await ContextCompaction(reactive=True).configure_session(ctx)
    assert caplog.text == ""


def test_the_framing_estimate_counts_each_schemas_text_once_per_schema_object() -> None:
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    tool = ToolDefinition("lookup", "Looks an order up.", schema)
    request = ModelRequest(model="m", system="Be brief.", messages=[], tools=[tool])
    expected = int((len("Be brief.") + len("lookup") + len("Looks an order up.") + len(str(schema))) / 4.0)
    assert ESTIMATE.framing(request) == ESTIMATE.framing(request) == expected

    chars = _SchemaChars(entries=2, chars=100)
    small = [{"n": n} for n in range(3)]
    assert [chars(s) for s in small] == [len(str(s)) for s in small]
    assert len(chars._kept) == 2 and id(small[0]) not in chars._kept  # the oldest forgotten
    small[1]["n"] = 10  # changed in place: the kept length stays (an estimate)
    assert chars(small[1]) == len("{'n': 1}")
    big = {"x": "y" * 200}  # above the characters kept: counted, not kept
    assert chars(big) == len(str(big)) and id(big) not in chars._kept
    assert chars._total == sum(n for _, n in chars._kept.values()) <= 100
