"""``SubmitToolResults`` and ``SubmitToolApprovals``: the client's answers to waiting tool calls.

docs/semantics.md §6 and §12. The answers are validated (INVALID_ARGUMENT, nothing
stored), then stored at once by one atomic store write
(:meth:`~turnwire_server.store.transcripts.TranscriptStore.answer_tool_calls`) that refuses, storing
nothing, an unknown call (NOT_FOUND ``TOOL_CALL_NOT_FOUND``), a call that does not wait
for this answer (FAILED_PRECONDITION ``TOOL_CALL_NOT_PENDING``) and an expired one
(FAILED_PRECONDITION ``EXPIRED``). That write also decides whether the answer completed
the assistant message's batch, so of concurrent answers exactly one sees the batch
complete. Then:

- other calls of the message still wait: the stream is ``ToolOutputDenied`` for each
  denial recorded, then ``TurnEnd(SKIPPED)`` carrying the stored message and an
  ``ErrorInfo`` reason ``TOOL_RESULTS_INCOMPLETE`` (metadata ``waiting_tool_call_ids``);
- the batch is complete but ``auto_continue`` is false: the same, without an error;
- the batch is complete and ``auto_continue`` is set: exactly one continuation turn runs
  (``continuation=true``, a new assistant message) and streams here; it first announces
  this request's denials and runs the approved calls (:mod:`turnwire_server.engine.approvals`).

``SaveMessages`` uses the same path for an assistant message holding only answered
tool-call parts that name stored calls (:meth:`ToolResultRpcs.tool_answers_in`); it always
continues, since it runs a turn.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import struct_pb2

from turnwire.tools import Tool
from turnwire.values import loads, tool_call_output_json
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.api.client_tool_input import check_client_tools
from turnwire_server.api.status import TurnwireStatusError, status_error_of
from turnwire_server.api.tenancy import caller_principal, scoped_key
from turnwire_server.api.turn_streams import (
    Started,
    disconnect_of,
    entry_of,
    parent_request_id,
    strategy_of,
    stream_turn,
    trace_context,
)
from turnwire_server.api.validation import check_id, json_object, raise_if_any
from turnwire_server.engine import TurnEngine, TurnRequest
from turnwire_server.engine.approvals import announce_answered_call
from turnwire_server.engine.budget_settings import BudgetLimit
from turnwire_server.engine.errors import AdmissionRefused
from turnwire_server.engine.ids import new_request_id
from turnwire_server.engine.request import ToolDenial
from turnwire_server.providers.registry import UnknownModel
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import StoreError
from turnwire_server.store.records import AnsweredToolCalls, ToolCallAnswer
from turnwire_server.store.waiting_calls import DENIED_BY_USER_TEXT

Violations = list[tuple[str, str]]

_ANSWER_STATES = frozenset(
    {
        message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
        message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
        message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
        message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED,
    }
)


class ToolResultRpcs:
    """The tool-answer RPCs of ``ChatService`` (a mixin: it uses the servicer's ``engine``,
    ``store``, ``default_model``, ``max_message_bytes``, ``progress_interval`` and
    ``batch_bytes``)."""

    engine: TurnEngine
    store: EngineStore
    default_model: str
    max_message_bytes: int
    progress_interval: float
    batch_bytes: int

    async def SubmitToolResults(
        self,
        request: chat_service_pb2.SubmitToolResultsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[chat_service_pb2.SubmitToolResultsResponse]:
        """Store client tool results at once; continue once the message's batch is complete."""

        async def start() -> Started:
            violations: Violations = []
            _check_common(request.conversation_id, request.request_id, violations)
            if not request.results:
                violations.append(("results", "must hold at least one result"))
            answers: list[ToolCallAnswer] = []
            seen: set[str] = set()
            for index, result in enumerate(request.results):
                field = f"results[{index}]"
                if _check_call_id(result.tool_call_id, f"{field}.tool_call_id", seen, violations):
                    answer = self._result_answer(result, field, violations)
                    if answer is not None:
                        answers.append(answer)
            client_tools = check_client_tools(request.client_tools, "client_tools", violations)
            raise_if_any(violations)
            return await self.answer_and_continue(
                context,
                chat_service_pb2.SubmitToolResultsResponse,
                conversation_id=request.conversation_id,
                answers=answers,
                auto_continue=request.auto_continue,
                request_id=request.request_id,
                body=request.body,
                model=request.model,
                client_tools=client_tools,
                disconnect_policy=request.disconnect_policy,
                concurrent_input=request.concurrent_input_strategy,
            )

        async for response in stream_turn(context, start, self.progress_interval, self.batch_bytes):
            yield response

    async def SubmitToolApprovals(
        self,
        request: chat_service_pb2.SubmitToolApprovalsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[chat_service_pb2.SubmitToolApprovalsResponse]:
        """Record approvals and denials at once; continue once no call of the message waits."""

        async def start() -> Started:
            violations: Violations = []
            _check_common(request.conversation_id, request.request_id, violations)
            if not request.approvals:
                violations.append(("approvals", "must hold at least one approval"))
            answers: list[ToolCallAnswer] = []
            seen: set[str] = set()
            for index, approval in enumerate(request.approvals):
                if _check_call_id(
                    approval.tool_call_id, f"approvals[{index}].tool_call_id", seen, violations
                ):
                    answers.append(
                        ToolCallAnswer(
                            approval.tool_call_id,
                            "approve" if approval.approved else "deny",
                            text=approval.reason,
                        )
                    )
            client_tools = check_client_tools(request.client_tools, "client_tools", violations)
            raise_if_any(violations)
            return await self.answer_and_continue(
                context,
                chat_service_pb2.SubmitToolApprovalsResponse,
                conversation_id=request.conversation_id,
                answers=answers,
                auto_continue=request.auto_continue,
                request_id=request.request_id,
                body=request.body,
                model=request.model,
                client_tools=client_tools,
                disconnect_policy=request.disconnect_policy,
                concurrent_input=request.concurrent_input_strategy,
            )

        async for response in stream_turn(context, start, self.progress_interval, self.batch_bytes):
            yield response

    # --- shared with SaveMessages ------------------------------------------------------

    async def tool_answers_in(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        violations: Violations,
    ) -> tuple[list[ToolCallAnswer], list[tuple[int, message_pb2.Message]]]:
        """Split ``SaveMessages.messages`` into tool answers and the messages to append (with their
        index in the request).

        An assistant message whose parts are all tool calls with a result, a denial or an approval
        answer is a tool answer when one of its calls is stored in the conversation (all of them
        must be: else NOT_FOUND at the store write); otherwise it is an ordinary message. Bad
        answers (output that is not JSON, a repeated call id) become ``violations``.
        """
        candidates = [
            (index, message)
            for index, message in enumerate(messages)
            if message.role == message_pb2.ROLE_ASSISTANT
            and message.parts
            and all(
                part.WhichOneof("kind") == "tool_call" and part.tool_call.state in _ANSWER_STATES
                for part in message.parts
            )
        ]
        if not candidates:
            return [], list(enumerate(messages))
        try:
            stored = {
                part.tool_call.tool_call_id
                for message in await self.store.load_messages(conversation_id)
                if message.role == message_pb2.ROLE_ASSISTANT
                for part in message.parts
                if part.WhichOneof("kind") == "tool_call"
            }
        except StoreError as error:
            raise status_error_of(error) from error
        answering = {
            index
            for index, message in candidates
            if any(part.tool_call.tool_call_id in stored for part in message.parts)
        }
        answers: list[ToolCallAnswer] = []
        seen: set[str] = set()
        for index in sorted(answering):
            for part_index, part in enumerate(messages[index].parts):
                call = part.tool_call
                field = f"messages[{index}].parts[{part_index}].tool_call"
                if not _check_call_id(call.tool_call_id, f"{field}.tool_call_id", seen, violations):
                    continue
                answer = self._part_answer(call, field, violations)
                if answer is not None:
                    answers.append(answer)
        plain = [(index, message) for index, message in enumerate(messages) if index not in answering]
        return answers, plain

    async def answer_and_continue(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        response_type: Callable[[], Any],
        *,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        auto_continue: bool,
        request_id: str,
        body: struct_pb2.Struct,
        model: str,
        client_tools: Sequence[Tool],
        messages: Sequence[message_pb2.Message] = (),
        disconnect_policy: int = 0,
        concurrent_input: int = 0,
        budget: BudgetLimit | None = None,
    ) -> Started:
        """Store ``answers`` (one atomic write), then start the turn that follows, or return the
        responses of a SKIPPED call (see the module docstring). ``budget``: the request's own
        turn budget (docs/cost.md, "Budgets").

        With ``messages`` (SaveMessages with other input too) an ordinary turn appending them
        runs whether or not the batch is complete. Raises :class:`TurnwireStatusError` for a
        refusal; when the answers were stored but the turn was not admitted, the message says
        they are stored. A request that asks for REJECT on a busy conversation is refused before
        the answers are stored (nothing stored, docs/semantics.md §5).
        """
        hook_body = json_object(body, "body")
        strategy = strategy_of(concurrent_input)
        model = model or self.default_model
        continues = bool(messages) or auto_continue
        if continues:
            self.engine.providers.resolve(model)  # UnknownModel before anything is stored
        request_id = request_id or scoped_key(new_request_id())
        reserved = (strategy or self.engine.settings.limits.concurrent_input) == "reject"
        if reserved:
            # REJECT is decided before the answers are stored, atomically with taking the turn's
            # place in line (so nothing admitted meanwhile, on any replica, slips in before it).
            try:
                await self.engine.line.reserve_if_idle(conversation_id, request_id)
            except AdmissionRefused as error:
                raise status_error_of(error) from error
        try:
            expiry = self.engine.settings.durability.pending_expiry_seconds
            expired_before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=expiry) if expiry > 0 else None
            outcome = await self.store.answer_tool_calls(
                conversation_id, answers, expired_before=expired_before
            )
        except BaseException:
            if reserved:
                await self.engine.line.release_place(conversation_id, request_id)
            raise
        calls = {
            part.tool_call.tool_call_id: part.tool_call
            for part in outcome.message.parts
            if part.WhichOneof("kind") == "tool_call"
        }
        denials = []
        for answer in answers:
            if answer.kind == "deny":
                call = calls.get(answer.tool_call_id, message_pb2.ToolCallPart())
                reason = answer.text or DENIED_BY_USER_TEXT
                denials.append(
                    ToolDenial(answer.tool_call_id, call.tool_name, reason, call.input_json, call.approval.id)
                )
        if not messages and not (outcome.completed and auto_continue):
            if reserved:
                await self.engine.line.release_place(conversation_id, request_id)
            return _skipped(response_type, conversation_id, request_id, outcome, denials)
        try:
            return await self.engine.start(
                TurnRequest(
                    conversation_id=conversation_id,
                    request_id=request_id,
                    messages=list(messages),
                    body=hook_body,
                    model=model,
                    continuation=not messages,
                    response_type=response_type,
                    client_tools=client_tools,
                    tool_denials=denials,
                    disconnect=disconnect_of(disconnect_policy),
                    entry=entry_of(response_type),
                    trace_context=trace_context(context),
                    concurrent_input=strategy,
                    budget=budget,
                    principal=caller_principal(),
                ),
                parent_request_id=parent_request_id(context),
                reserved=reserved,
            )
        except (AdmissionRefused, UnknownModel) as error:
            refused = status_error_of(error)
            raise TurnwireStatusError(
                refused.code,
                f"{refused.message} (the tool answers are stored; run the turn with ContinueLastTurn)",
                reason=refused.reason,
                field_violations=refused.field_violations,
                retry_after_seconds=refused.retry_after_seconds,
                metadata=refused.metadata,
            ) from error

    # --- answers -----------------------------------------------------------------------

    def _result_answer(
        self, result: chat_service_pb2.ToolResult, field: str, violations: Violations
    ) -> ToolCallAnswer | None:
        """A client result as an answer; a violation (and None) when its output is not JSON text
        (exact values: docs/semantics.md §11) or is over ``limits.max_message_bytes``."""
        if result.error:
            return ToolCallAnswer(result.tool_call_id, "error", text=result.error_text)
        size = len(result.output_json.encode())
        if size > self.max_message_bytes:
            limit = f"{self.max_message_bytes:,} bytes (limits.max_message_bytes)"
            violations.append((f"{field}.output_json", f"is {size:,} bytes; the limit is {limit}"))
            return None
        try:
            loads(result.output_json)
        except ValueError as problem:
            violations.append(
                (f"{field}.output_json", f'must be JSON text (any JSON value, e.g. {{}} or "ok"): {problem}')
            )
            return None
        return ToolCallAnswer(result.tool_call_id, "output", output_json=result.output_json)

    def _part_answer(
        self, call: message_pb2.ToolCallPart, field: str, violations: Violations
    ) -> ToolCallAnswer | None:
        """An answered tool-call part of SaveMessages as an answer."""
        state = call.state
        if state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
            output_json = tool_call_output_json(call)
            result = chat_service_pb2.ToolResult(tool_call_id=call.tool_call_id, output_json=output_json)
            return self._result_answer(result, field, violations)
        if state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
            return ToolCallAnswer(call.tool_call_id, "error", text=call.error_text)
        if state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
            return ToolCallAnswer(call.tool_call_id, "deny", text=call.approval.reason or call.error_text)
        if call.approval.approved:
            return ToolCallAnswer(call.tool_call_id, "approve", text=call.approval.reason)
        return ToolCallAnswer(call.tool_call_id, "deny", text=call.approval.reason)


def _check_common(conversation_id: str, request_id: str, violations: Violations) -> None:
    check_id(conversation_id, "conversation_id", violations, required=True)
    check_id(request_id, "request_id", violations, required=False, client_chosen=True)


def _check_call_id(tool_call_id: str, field: str, seen: set[str], violations: Violations) -> bool:
    """False (with a violation) for an empty or repeated call id."""
    if not tool_call_id:
        violations.append((field, "must name the tool call (its tool_call_id)"))
        return False
    if tool_call_id in seen:
        violations.append((field, f"repeats {tool_call_id!r}: answer each call once"))
        return False
    seen.add(tool_call_id)
    return True


def _skipped(
    response_type: Callable[[], Any],
    conversation_id: str,
    request_id: str,
    outcome: AnsweredToolCalls,
    denials: Sequence[ToolDenial],
) -> list[Any]:
    """The responses of a call that stored answers and runs no turn: a ``ToolInputAvailable`` and
    a ``ToolOutputDenied`` per denial (as a continuation announces them), then
    ``TurnEnd(SKIPPED)`` with the stored message (and why, when calls still wait)."""
    responses: list[Any] = []

    def new() -> event_pb2.TurnEvent:
        response = response_type()
        event: event_pb2.TurnEvent = response.event
        event.conversation_id = conversation_id
        event.request_id = request_id
        event.sequence_number = len(responses) + 1
        responses.append(response)
        return event

    for denial in denials:
        announce_answered_call(
            new(), denial.tool_call_id, denial.tool_name, denial.input_json, denial.approval_id
        )
        denied = new().tool_output_denied
        denied.tool_call_id = denial.tool_call_id
        denied.tool_name = denial.tool_name
        denied.reason = denial.reason
    end = new().turn_end
    end.status = event_pb2.TURN_STATUS_SKIPPED
    end.message.CopyFrom(outcome.message)
    if outcome.waiting:
        waiting = ", ".join(outcome.waiting)
        end.error.CopyFrom(
            TurnwireStatusError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the answers are stored; {len(outcome.waiting)} other tool call(s) of message "
                f"{outcome.message.id!r} still wait ({waiting}): "
                "the continuation runs once they are answered",
                reason="TOOL_RESULTS_INCOMPLETE",
                metadata={"waiting_tool_call_ids": waiting, "message_id": outcome.message.id},
            ).to_status()
        )
    return responses
