"""How ``turnwire history`` and ``turnwire chat`` render tool calls (``turnwire_server.console``).

A fresh-user trial saw a call cut off while its input streamed printed as ``→ tool {}``, as if
the model had called it with an empty input; values come from the exact JSON fields, so large
integers print as they were stored.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from turnwire_client.v1 import message_pb2
from turnwire_server.console import _print_message


def _render(*calls: message_pb2.ToolCallPart) -> list[str]:
    buffer = io.StringIO()
    message = message_pb2.Message(
        id="m1",
        role=message_pb2.ROLE_ASSISTANT,
        parts=[message_pb2.Part(tool_call=call) for call in calls],
    )
    _print_message(Console(file=buffer, width=200), message)
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
    from turnwire_server.console import _run_turn

    reached = asyncio.Event()

    async def queued(_client: object) -> AsyncIterator[event_pb2.TurnEvent]:
        reached.set()
        await asyncio.Event().wait()  # the sidecar holds the call: a turn ahead runs first
        yield event_pb2.TurnEvent()

    buffer = io.StringIO()
    task = asyncio.create_task(
        _run_turn(
            "127.0.0.1:9", "cli-q", queued, tls=None, console=Console(file=buffer, width=200), token=None
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
    from turnwire_server.console import _TurnRenderer

    renderer = _TurnRenderer(Console(file=io.StringIO(), force_terminal=True, width=200), "cli-p")
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
        "? get_current_time awaits approval (call c7: the application answers with SubmitToolApprovals, "
        "then the turn goes on)"
    )
