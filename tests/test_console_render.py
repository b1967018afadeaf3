"""How ``turnwire history`` and ``turnwire chat`` render tool calls (``turnwire_server.cli``:
``parts``, ``live``, ``history``, ``turns``).

A fresh-user trial saw a call cut off while its input streamed printed as ``→ tool {}``, as if
the model had called it with an empty input; values come from the exact JSON fields, so large
integers print as they were stored.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from turnwire_client.v1 import message_pb2
from turnwire_server.cli.history import print_message


def _render(*calls: message_pb2.ToolCallPart) -> list[str]:
    buffer = io.StringIO()
    message = message_pb2.Message(
        id="m1",
        role=message_pb2.ROLE_ASSISTANT,
        parts=[message_pb2.Part(tool_call=call) for call in calls],
    )
    print_message(Console(file=buffer, width=200), message, "conv-1")
    return buffer.getvalue().splitlines()[1:]


def test_a_call_stopped_before_its_input_arrived_is_not_shown_as_an_empty_input() -> None:
    lines = _render(
        message_pb2.ToolCallPart(
            tool_call_id="c1",
            tool_name="search",
            state=message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
            error_text="the turn was aborted",
        )
    )
    assert lines == ["→ search (input not received)", "← search: error: the turn was aborted"]


def test_a_call_cut_off_while_its_input_streamed_shows_what_arrived() -> None:
    lines = _render(
        message_pb2.ToolCallPart(
            tool_call_id="c1",
            tool_name="search",
            raw_input='{"query": "wea',
            state=message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
            error_text="the turn was aborted",
        )
    )
    assert lines[0] == '→ search {"query": "wea'


def test_inputs_and_outputs_print_exactly_from_their_json_text() -> None:
    big = 2**53 + 1
    lines = _render(
        message_pb2.ToolCallPart(
            tool_call_id="c1",
            tool_name="count",
            input_json=f'{{"n": {big}, "empty": {{}}}}',
            output_json=f'{{"total": {big}, "ratio": 0.5}}',
            state=message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
        ),
        message_pb2.ToolCallPart(
            tool_call_id="c2",
            tool_name="noop",
            input_json="{}",
            output_json="null",
            state=message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
        ),
    )
    assert lines == [
        f'→ count {{"empty": {{}}, "n": {big}}}',
        f'← count: {{"ratio": 0.5, "total": {big}}}',
        "→ noop {}",
        "← noop: null",
    ]


async def test_ctrl_c_before_the_turn_started_says_nothing_was_stored() -> None:
    """Cancelled while queued behind another turn (no TurnStart yet: the input is not stored), the
    CLI must not claim a stored partial reply (a fresh-user trial found it did)."""
    import asyncio
    from collections.abc import AsyncIterator

    from turnwire_client.v1 import event_pb2
    from turnwire_server.cli.connection import Connection
    from turnwire_server.cli.turns import run_turn

    reached = asyncio.Event()

    async def queued(_client: object, _request_id: str) -> AsyncIterator[event_pb2.TurnEvent]:
        reached.set()
        await asyncio.Event().wait()  # the sidecar holds the call: a turn ahead runs first
        yield event_pb2.TurnEvent()

    buffer = io.StringIO()
    task = asyncio.create_task(
        run_turn(
            Connection("127.0.0.1:9"),
            "CONVERSATION",
            queued,
            request_id="cli-q",
            console=Console(file=buffer, width=200),
        )
    )
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert buffer.getvalue().strip() == (
        "ABORTED by Ctrl-C · request cli-q: cancelled before the turn started; nothing was stored"
    )


def test_the_spinner_comes_back_after_a_preliminary_result() -> None:
    """A streaming tool's preliminary line is printed above the spinner, which stays up while the
    tool goes on (it vanished after the first preliminary result)."""
    from turnwire_client.v1 import event_pb2
    from turnwire_server.cli.live import TurnRenderer

    renderer = TurnRenderer(Console(file=io.StringIO(), force_terminal=True, width=200), "cli-p")
    try:
        called = event_pb2.TurnEvent(
            tool_input_available=event_pb2.ToolInputAvailable(
                tool_call_id="c1", tool_name="count", input_json="{}"
            )
        )
        renderer.render(called)
        preliminary = event_pb2.TurnEvent(
            tool_output_available=event_pb2.ToolOutputAvailable(
                tool_call_id="c1", output_json='{"progress": 0}', preliminary=True
            )
        )
        renderer.render(preliminary)
        assert renderer.waiting is not None
        final = event_pb2.TurnEvent(
            tool_output_available=event_pb2.ToolOutputAvailable(tool_call_id="c1", output_json='{"n": 2}')
        )
        renderer.render(final)
        assert renderer.waiting is None
    finally:
        renderer.stop_waiting()


def test_a_call_awaiting_approval_says_who_answers_it() -> None:
    lines = _render(
        message_pb2.ToolCallPart(
            tool_call_id="c7",
            tool_name="get_current_time",
            input_json="{}",
            state=message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED,
        )
    )
    assert lines[1] == (
        "? get_current_time awaits approval (call c7: `turnwire approve conv-1 c7`, or add --deny "
        "[--reason TEXT]; the turn goes on)"
    )


def _turn_lines(*events: Any) -> list[str]:
    """What ``turnwire chat`` prints for ``events`` (piped: plain text)."""
    from turnwire_server.cli.live import TurnRenderer

    buffer = io.StringIO()
    renderer = TurnRenderer(Console(file=buffer, width=200), "cli-r")
    for event in events:
        renderer.render(event)
    renderer.end_line()
    return buffer.getvalue().splitlines()


def _output(value: str, *, preliminary: bool = False) -> Any:
    from turnwire_client.v1 import event_pb2

    return event_pb2.TurnEvent(
        tool_output_available=event_pb2.ToolOutputAvailable(
            tool_call_id="c1", output_json=value, preliminary=preliminary
        )
    )


def test_a_final_result_equal_to_the_last_preliminary_is_not_printed_again() -> None:
    from turnwire_client.v1 import event_pb2

    called = event_pb2.TurnEvent(
        tool_input_available=event_pb2.ToolInputAvailable(
            tool_call_id="c1", tool_name="count", input_json="{}"
        )
    )
    same = _turn_lines(called, _output("1", preliminary=True), _output("2", preliminary=True), _output("2"))
    assert same == [
        "→ count {}",
        "… count: 1 (preliminary)",
        "… count: 2 (preliminary)",
        "← count: final result as above",
    ]
    # A final value the preliminary ones did not show is printed as the result.
    other = _turn_lines(called, _output("1", preliminary=True), _output('"done"'))
    assert other[-1] == '← count: "done"'


def _step_finished() -> Any:
    from turnwire_client.v1 import event_pb2

    return event_pb2.TurnEvent(step_finish=event_pb2.StepFinish(finish_reason=event_pb2.FINISH_REASON_STOP))


_STEP_FINISHED = _step_finished()


def _status_line(result: Any, *, output_streamed: bool) -> str:
    from turnwire_server.cli.live import print_status_line

    buffer = io.StringIO()
    print_status_line(
        Console(file=buffer, width=200), result, "scripted:slow", output_streamed=output_streamed
    )
    return buffer.getvalue().strip()


def test_the_token_count_says_what_the_provider_did_not_report() -> None:
    """A stream cut by a cancel before the provider's usage event has input tokens counted and no
    output count: "out 0" after streamed text would be wrong."""
    from turnwire_client import TurnResult
    from turnwire_client.v1 import event_pb2
    from turnwire_client.values import Usage

    def result(input_tokens: int, output_tokens: int) -> Any:
        usage = Usage(input_tokens, output_tokens, input_tokens + output_tokens)
        return TurnResult(
            "c", "r", event_pb2.TURN_STATUS_INTERRUPTED, None, usage, None, [_STEP_FINISHED], step_count=1
        )

    assert _status_line(result(12, 0), output_streamed=True) == (
        "INTERRUPTED · 1 step · tokens in 12 / out not reported · scripted:slow"
    )
    assert _status_line(result(12, 7), output_streamed=True) == (
        "INTERRUPTED · 1 step · tokens in 12 / out 7 · scripted:slow"
    )
    assert _status_line(result(0, 0), output_streamed=True) == "INTERRUPTED · 1 step · scripted:slow"


def test_the_token_count_shows_the_prompt_cache_reads_and_writes() -> None:
    """A fresh-user trial: tokens written to the provider's cache (priced apart) were not shown."""
    from turnwire_client import TurnResult
    from turnwire_client.v1 import event_pb2
    from turnwire_client.values import Usage

    usage = Usage(1200, 40, 1240, cached_input_tokens=800, cache_write_input_tokens=300)
    result = TurnResult(
        "c", "r", event_pb2.TURN_STATUS_COMPLETED, None, usage, None, [_STEP_FINISHED], step_count=1
    )
    assert _status_line(result, output_streamed=True) == (
        "COMPLETED · 1 step · tokens in 1200 / out 40 · cached 800 · cache write 300 · scripted:slow"
    )


def test_sidecar_messages_name_the_cli_commands() -> None:
    from turnwire_server.cli.errors import cli_terms

    assert cli_terms("conversation 'x' does not exist; start it with Chat or SaveMessages") == (
        "conversation 'x' does not exist; start it with `turnwire chat`"
    )
    assert cli_terms("run the turn with ContinueLastTurn") == "run the turn with `turnwire continue`"
    # Provider wording that merely contains a word is left alone.
    assert cli_terms("Chat Completions does not take it") == "Chat Completions does not take it"


async def _ctrl_c_line(*before: Any) -> str:
    """The last line ``turnwire chat`` prints when Ctrl-C comes after ``before``."""
    return (await _ctrl_c_output(*before))[-1]


async def _ctrl_c_output(*before: Any) -> list[str]:
    """What ``turnwire chat`` prints when Ctrl-C comes after ``before`` (the turn then hangs)."""
    import asyncio
    from collections.abc import AsyncIterator

    from turnwire_client.v1 import event_pb2
    from turnwire_server.cli.connection import Connection
    from turnwire_server.cli.turns import run_turn

    reached = asyncio.Event()

    async def stream(_client: object, _request_id: str) -> AsyncIterator[event_pb2.TurnEvent]:
        for number, event in enumerate(before, 1):
            event.sequence_number = number
            yield event
        reached.set()
        await asyncio.Event().wait()
        yield event_pb2.TurnEvent()

    buffer = io.StringIO()
    task = asyncio.create_task(
        run_turn(
            Connection("127.0.0.1:9"),
            "CONVERSATION",
            stream,
            request_id="cli-s",
            console=Console(file=buffer, width=300),
            err_console=Console(file=io.StringIO()),
        )
    )
    await reached.wait()
    await asyncio.sleep(0)  # the last event is rendered once the consumer asks for the next
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return buffer.getvalue().splitlines()


async def test_ctrl_c_before_any_reply_says_no_reply_was_stored() -> None:
    """Trial 3: Ctrl-C before the first token said "the partial reply is stored as aborted", yet a
    reply without content is not stored (docs/semantics.md §11) and `history` showed none."""
    from turnwire_client.v1 import event_pb2

    start = event_pb2.TurnEvent(turn_start=event_pb2.TurnStart(model="p:m"))
    step = event_pb2.TurnEvent(step_start=event_pb2.StepStart())
    assert await _ctrl_c_line(start, step) == (
        "ABORTED by Ctrl-C · request cli-s: your message is stored; no reply had arrived, so none was stored"
    )
    text = event_pb2.TurnEvent(text_start=event_pb2.TextStart(id="t"))
    delta = event_pb2.TurnEvent(text_delta=event_pb2.TextDelta(id="t", delta="Hel"))
    start = event_pb2.TurnEvent(turn_start=event_pb2.TurnStart(model="p:m"))
    step = event_pb2.TurnEvent(step_start=event_pb2.StepStart())
    assert await _ctrl_c_line(start, step, text, delta) == (
        "ABORTED by Ctrl-C · request cli-s: the partial reply is stored as aborted"
    )


def _status(code: int, message: str, reason: str, **metadata: str) -> Any:
    """A google.rpc.Status with an ErrorInfo, as a TurnEnd carries it."""
    from google.rpc import error_details_pb2, status_pb2

    status = status_pb2.Status(code=code, message=message)
    status.details.add().Pack(
        error_details_pb2.ErrorInfo(reason=reason, domain="turnwire.dev", metadata=metadata)
    )
    return status


def _result(status: Any, *events: Any, error: Any = None, step_count: int = 1) -> Any:
    from turnwire_client import TurnResult
    from turnwire_client.values import Usage

    return TurnResult("c", "r", status, None, Usage(0, 0, 0), error, list(events), step_count=step_count)


def test_an_abort_from_elsewhere_says_where_it_can_come_from() -> None:
    """Trial 3: a `turnwire cancel` or a sidecar shutdown showed a bare "ABORTED · 2 steps"; the
    stream carries no reason for a plain cancel, so the line names the possible sources."""
    from turnwire_client.v1 import event_pb2

    assert _status_line(
        _result(event_pb2.TURN_STATUS_ABORTED, _STEP_FINISHED, step_count=2), output_streamed=False
    ) == ("ABORTED (cancelled elsewhere: `turnwire cancel` or another client) · 2 steps · scripted:slow")
    # An abort the stream gives a reason for says that reason instead.
    interrupted = _status(10, "interrupted by request cli-b", "INTERRUPTED")
    line = _status_line(
        _result(event_pb2.TURN_STATUS_ABORTED, _STEP_FINISHED, error=interrupted), output_streamed=False
    )
    assert line == "ABORTED [INTERRUPTED]: interrupted by request cli-b · 1 step · scripted:slow"


def test_a_provider_error_names_its_class_as_the_sidecar_log_does() -> None:
    """Trial 3: chat said "(server error)" where the sidecar's log said classification='transient';
    and a turn whose model never answered showed "· 1 step"."""
    from turnwire_client.v1 import event_pb2

    error = _status(
        14, "model provider error: HTTP 500", "PROVIDER_ERROR", provider_error_class="server_error"
    )
    assert _status_line(_result(event_pb2.TURN_STATUS_ERROR, error=error), output_streamed=False) == (
        "ERROR [PROVIDER_ERROR] (transient: server_error): model provider error: HTTP 500 · scripted:slow"
    )


def test_an_aborted_tool_call_is_marked_apart_from_a_failing_tool() -> None:
    """Trial 3: a call cut off by a cancel printed "error: The tool call was aborted …", like a tool
    that failed; it is marked aborted (live and in history), as blocked and denied calls are."""
    from turnwire.errors import ABORTED_TOOL_ERROR, INTERRUPTED_TOOL_ERROR
    from turnwire_client.v1 import event_pb2
    from turnwire_server.cli import parts

    called = event_pb2.TurnEvent(
        tool_input_available=event_pb2.ToolInputAvailable(
            tool_call_id="c1", tool_name="track_order", input_json="{}"
        )
    )
    cut = event_pb2.TurnEvent(
        tool_output_error=event_pb2.ToolOutputError(tool_call_id="c1", error_text=ABORTED_TOOL_ERROR)
    )
    assert _turn_lines(called, cut)[-1] == "← track_order: aborted before it finished (the turn stopped)"
    stored = _render(
        message_pb2.ToolCallPart(
            tool_call_id="c1",
            tool_name="track_order",
            input_json="{}",
            state=message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
            error_text=INTERRUPTED_TOOL_ERROR,
        )
    )
    assert stored[-1] == "← track_order: interrupted: no result was recorded"
    # The style differs from a failing tool's too (what a terminal shows).
    assert parts.error_line("t", ABORTED_TOOL_ERROR).spans != parts.error_line("t", "boom").spans


async def test_ctrl_c_during_a_tool_shows_it_aborted_as_history_will() -> None:
    """Trial 4: Ctrl-C while a streaming tool ran printed its preliminary lines and then only the
    ABORTED line; `turnwire cancel` and `history` show the call aborted. A finished call is not."""
    from turnwire_client.v1 import event_pb2

    def call(call_id: str, name: str) -> Any:
        return event_pb2.TurnEvent(
            tool_input_available=event_pb2.ToolInputAvailable(
                tool_call_id=call_id, tool_name=name, input_json='{"id": 1}'
            )
        )

    events = [
        event_pb2.TurnEvent(turn_start=event_pb2.TurnStart(model="p:m")),
        event_pb2.TurnEvent(step_start=event_pb2.StepStart()),
        call("c1", "lookup_order"),
        call("c2", "track_order"),
        event_pb2.TurnEvent(
            tool_output_available=event_pb2.ToolOutputAvailable(tool_call_id="c1", output_json='"ok"')
        ),
        event_pb2.TurnEvent(
            tool_output_available=event_pb2.ToolOutputAvailable(
                tool_call_id="c2", output_json='"packing"', preliminary=True
            )
        ),
    ]
    lines = await _ctrl_c_output(*events)
    assert lines[-2:] == [
        "← track_order: aborted before it finished (the turn stopped)",
        "ABORTED by Ctrl-C · request cli-s: the partial reply is stored as aborted",
    ]
    assert not any("lookup_order: aborted" in line for line in lines)


def test_a_progress_keepalive_says_what_the_turn_waits_for() -> None:
    """A turn queued behind another said "waiting for the sidecar" for as long as it waited (a
    trial finding): a ``Progress`` keepalive now puts its phase and elapsed time on the spinner,
    and is not taken as the turn's start."""
    from google.protobuf import duration_pb2

    from turnwire_client.v1 import event_pb2
    from turnwire_server.cli.live import TurnRenderer

    renderer = TurnRenderer(Console(file=io.StringIO(), force_terminal=True, width=200), "cli-q")
    try:
        assert renderer.waiting is not None
        assert "waiting for the sidecar" in str(renderer.waiting.status)
        queued = event_pb2.TurnEvent(
            progress=event_pb2.Progress(
                phase=event_pb2.PROGRESS_PHASE_QUEUED, elapsed=duration_pb2.Duration(seconds=15)
            )
        )
        renderer.render(queued)
        assert renderer.waiting is not None
        assert "queued behind the conversation's running turn (15 s)" in str(renderer.waiting.status)
        assert not renderer.started
        tool = event_pb2.TurnEvent(
            progress=event_pb2.Progress(
                phase=event_pb2.PROGRESS_PHASE_TOOL, elapsed=duration_pb2.Duration(seconds=30)
            )
        )
        renderer.render(tool)
        assert "running the tool (30 s)" in str(renderer.waiting.status)
    finally:
        renderer.stop_waiting()


def test_history_shows_what_a_source_cites_and_where_a_file_is() -> None:
    """``turnwire history``: a source with its cited passage and location; files by bytes, provider
    id, or size when their bytes were not kept (issue 31)."""
    message = message_pb2.Message(id="a1", role=message_pb2.ROLE_ASSISTANT)
    message.parts.add().text.CopyFrom(message_pb2.TextPart(text="Built 1887-1889.", id="b1"))
    source = message.parts.add().source
    source.CopyFrom(
        message_pb2.SourcePart(
            source_id="s1",
            title="Tower notes",
            source_type=message_pb2.SOURCE_TYPE_DOCUMENT,
            cited_text="Built between\n1887 and 1889.",
            text_id="b1",
            location=message_pb2.SourceLocation(
                unit=message_pb2.SOURCE_LOCATION_UNIT_PAGE, document_index=1, start=3, end=4
            ),
        )
    )
    message.parts.add().file.CopyFrom(message_pb2.FilePart(media_type="image/png", data=b"12345"))
    message.parts.add().file.CopyFrom(message_pb2.FilePart(media_type="image/png", size_bytes=4_000_000))
    message.parts.add().file.CopyFrom(message_pb2.FilePart(provider_file_id="file_01", media_type="text/csv"))
    buffer = io.StringIO()
    print_message(Console(file=buffer, width=200), message, "conv-1")
    lines = buffer.getvalue().splitlines()
    assert '[source] Tower notes "Built between 1887 and 1889." (pages 3-3 of document 2)' in lines
    assert "[file] image/png 5 bytes" in lines
    assert "[file] image/png 4000000 bytes, not kept" in lines
    assert "[file] text/csv file_01 (kept by the provider)" in lines


def test_a_fallback_names_the_model_that_goes_on_and_shows_its_step_once() -> None:
    """A fresh-user trial: after a fallback the status line named the configured model, and the
    step's line was printed again with every StepStart the fallback repeats."""
    from turnwire_client.v1 import event_pb2
    from turnwire_server.cli.live import TurnRenderer

    buffer = io.StringIO()
    renderer = TurnRenderer(Console(file=buffer, width=200), "cli-f")
    events = [
        event_pb2.TurnEvent(turn_start=event_pb2.TurnStart(model="anthropic:claude-sonnet-4-5")),
        event_pb2.TurnEvent(step_start=event_pb2.StepStart(step_number=1)),
        event_pb2.TurnEvent(
            attempt_start=event_pb2.AttemptStart(
                attempt=2, reason="PROVIDER_FALLBACK", model="openai:gpt-4o", appends=True
            )
        ),
        event_pb2.TurnEvent(step_start=event_pb2.StepStart(step_number=1)),
    ]
    try:
        for event in events:
            renderer.render(event)
    finally:
        renderer.stop_waiting()
    lines = buffer.getvalue().splitlines()
    assert [line for line in lines if line.startswith("· step")] == ["· step 2"]
    assert "(attempt 2 after provider fallback: continuing the reply on openai:gpt-4o)" in lines
    assert renderer.model == "openai:gpt-4o"


def test_an_attempt_after_a_takeover_does_not_say_the_server_restarted() -> None:
    """An operator trial: a turn another replica took over printed "attempt 2 after server
    restarted", though no server restarted (the reason covers both)."""
    from turnwire_client.v1 import event_pb2
    from turnwire_server.cli.live import TurnRenderer

    buffer = io.StringIO()
    renderer = TurnRenderer(Console(file=buffer, width=200))
    try:
        renderer.render(
            event_pb2.TurnEvent(
                attempt_start=event_pb2.AttemptStart(attempt=2, reason="SERVER_RESTARTED", appends=True)
            )
        )
    finally:
        renderer.stop_waiting()
    assert buffer.getvalue().strip() == (
        "(attempt 2 after its sidecar stopped (a restart, or another replica took the turn over):"
        " continuing the reply)"
    )
