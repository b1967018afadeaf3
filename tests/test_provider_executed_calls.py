"""Issue 31a in process: how the engine treats calls the provider runs itself and calls of built-ins
the API defines as the application's (docs/semantics.md §3, §6; docs/providers.md, "What each API's
parts become"). A provider double streams the adapters' chunks as the Anthropic and Responses
adapters give them (tests/providers/test_provider_executed_tools.py replays the wire)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from support.chunk_steps import Steps
from support.engine_harness import CONV, EngineFactory, end_of, of_kind

from turnwire import types as chunks
from turnwire.hooks import Middleware, StepFinishContext, ToolCallContext, ToolCallDecision
from turnwire.tools import ToolExecution, tool
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.step_record import MAX_STEP_METADATA_BYTES

SEARCH = "srvtoolu_01Search"


class Recorder(Middleware):
    def __init__(self) -> None:
        super().__init__()
        self.offered: list[str] = []
        self.steps: list[StepFinishContext] = []

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        self.offered.append(ctx.tool_name)
        return None

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.steps.append(ctx)


def _search_call(*, with_result: bool = True) -> list[chunks.ModelChunk]:
    call: list[chunks.ModelChunk] = [
        chunks.ToolInputStart(SEARCH, "web_search", provider_executed=True),
        chunks.ToolInputDelta(SEARCH, '{"query": "q"}'),
        chunks.ToolCall(
            SEARCH,
            "web_search",
            {"query": "q"},
            raw_input='{"query": "q"}',
            provider_executed=True,
            provider_metadata={"anthropic": {"call": {"type": "server_tool_use", "id": SEARCH}}},
        ),
    ]
    return [*call, _search_result()] if with_result else call


def _search_result() -> chunks.ToolResult:
    record = {"anthropic": {"result": {"type": "web_search_tool_result", "tool_use_id": SEARCH}}}
    return chunks.ToolResult(
        SEARCH, "web_search", output=[{"url": "https://example.org"}], provider_metadata=record
    )


def _text(value: str, block: str = "t") -> list[chunks.ModelChunk]:
    return [chunks.TextStart(block), chunks.TextDelta(block, value), chunks.TextEnd(block)]


def _finish(reason: chunks.FinishReason = chunks.FinishReason.STOP, **fields: Any) -> chunks.FinishStep:
    return chunks.FinishStep(reason, response_id="msg_1", response_model="claude-x", **fields)


class Query(BaseModel):
    query: str


@tool(Query)
async def web_search(input: Query, execution: ToolExecution) -> str:
    """A local tool of the same name: must never run for the provider's call."""
    raise AssertionError("a provider-executed call was run locally")


async def test_a_provider_executed_call_is_stored_streamed_and_never_run(make_engine: EngineFactory) -> None:
    provider = Steps([*_search_call(), *_text("Found it."), _finish()])
    recorder = Recorder()
    h = await make_engine(providers={"chunks": provider}, middlewares=[recorder], tools=[web_search])
    events = await h.run("search", model="chunks:m")

    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert recorder.offered == [], "never offered to before_tool_call as if local"
    assert len(provider.requests) == 1, "the provider ran it: no second step to answer it"
    (start,) = of_kind(events, "tool_input_start")
    assert (start.tool_call_id, start.provider_executed) == (SEARCH, True)
    (available,) = of_kind(events, "tool_input_available")
    assert available.provider_executed and available.input_json == '{"query": "q"}'
    (output,) = of_kind(events, "tool_output_available")
    assert output.provider_executed and output.output_json == '[{"url":"https://example.org"}]'

    (step,) = recorder.steps
    assert [(c.tool_call_id, c.provider_executed) for c in step.tool_calls] == [(SEARCH, True)]
    assert [c.tool_call_id for c in step.tool_results] == [SEARCH]
    stored = (await h.store.load_messages(CONV))[-1]
    assert stored == end_of(events).message
    (call,) = [p.tool_call for p in stored.parts if p.WhichOneof("kind") == "tool_call"]
    assert call.provider_executed and call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    fields = call.provider_metadata.fields["anthropic"].struct_value.fields
    assert set(fields) == {"call", "result"}, "what the API needs back, call and result"


async def test_a_result_in_a_later_step_is_that_steps_result(make_engine: EngineFactory) -> None:
    """Anthropic's pause_turn: the search's result comes in the next step, on the same part."""
    provider = Steps(
        [*_search_call(with_result=False), _finish(chunks.FinishReason.OTHER, paused=True)],
        [_search_result(), *_text("Found it."), _finish()],
    )
    recorder = Recorder()
    h = await make_engine(providers={"chunks": provider}, middlewares=[recorder])
    events = await h.run("search", model="chunks:m")

    assert len(provider.requests) == 2
    first, second = recorder.steps
    assert not first.last_step and second.last_step  # a paused step is continued, not the last
    assert [c.tool_call_id for c in first.tool_calls] == [SEARCH] and not first.tool_results
    assert not second.tool_calls and [c.tool_call_id for c in second.tool_results] == [SEARCH]
    calls = [p.tool_call for p in end_of(events).message.parts if p.WhichOneof("kind") == "tool_call"]
    assert [c.state for c in calls] == [message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE]


async def test_a_built_in_the_application_runs_waits_for_it(make_engine: EngineFactory) -> None:
    """A Responses shell_call with no tool of that name in the turn: a client tool's call, not an
    unknown-tool error and not a silent stop."""
    shell = chunks.ToolCall(
        "call_sh",
        "shell",
        {"action": {"commands": ["ls"]}},
        raw_input='{"action":{"commands":["ls"]}}',
        client_executed=True,
        provider_metadata={"openai": {"type": "shell_call", "item_id": "sh_1"}},
    )
    provider = Steps(
        [chunks.ToolInputStart("call_sh", "shell"), shell, _finish(chunks.FinishReason.TOOL_CALLS)]
    )
    recorder = Recorder()
    h = await make_engine(providers={"chunks": provider}, middlewares=[recorder])
    events = await h.run("list files", model="chunks:m")

    assert of_kind(events, "tool_input_error") == []
    assert recorder.offered == []
    (call,) = [p.tool_call for p in end_of(events).message.parts if p.WhichOneof("kind") == "tool_call"]
    assert call.client_executed and call.state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    assert not call.provider_executed
    assert call.provider_metadata.fields["openai"].struct_value.fields["type"].string_value == "shell_call"


async def test_a_step_record_is_bounded_stored_and_streamed(make_engine: EngineFactory) -> None:
    logprobs = [{"token": f"t{i}", "logprob": -0.5, "top_logprobs": []} for i in range(4000)]
    metadata = {"openai": {"logprobs": logprobs, "phases": [{"item_id": "msg_1", "phase": "final_answer"}]}}
    provider = Steps([*_text("Hi."), _finish(provider_metadata=metadata, warnings=["top_k was not sent"])])
    recorder = Recorder()
    h = await make_engine(providers={"chunks": provider}, middlewares=[recorder])
    events = await h.run("hi", model="chunks:m")

    (step,) = recorder.steps
    assert step.provider_metadata == {"openai": {"phases": [{"item_id": "msg_1", "phase": "final_answer"}]}}
    assert step.warnings[0] == "top_k was not sent"
    assert step.warnings[1].startswith("provider metadata openai.logprobs (")
    assert f"at most {MAX_STEP_METADATA_BYTES:,} bytes" in step.warnings[1]
    (finish,) = of_kind(events, "step_finish")
    assert list(finish.warnings) == list(step.warnings)
    assert "logprobs" not in finish.provider_metadata.fields["openai"].struct_value.fields
    marker = end_of(events).message.parts[0].step_start
    assert (marker.response_id, marker.response_model) == ("msg_1", "claude-x")
    assert list(marker.warnings) == list(step.warnings)
    assert marker.provider_metadata == finish.provider_metadata
