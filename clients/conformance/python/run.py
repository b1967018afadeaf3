"""Python conformance runner: every case of clients/conformance/cases against real sidecars.

Usage: ``python clients/conformance/python/run.py [CASE_NAME ...]`` (default: all cases).
Starts one ``turnwire serve`` per distinct config (``TURNWIRE_BIN``, default the repo's
``.venv/bin/turnwire``), runs the cases in file order through ``turnwire_client.TurnwireClient``,
prints one line per case and ``N passed, M failed``; exits 1 when a case failed. The case
format and the matching rules are in clients/conformance/README.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2, webhook_pb2

REPO = Path(__file__).resolve().parents[3]
# The suite's folder (cases/, configs/); another one for the runners' own tests.
SUITE = Path(os.environ.get("TURNWIRE_CONFORMANCE_DIR") or REPO / "clients" / "conformance")
TURNWIRE_BIN = os.environ.get("TURNWIRE_BIN") or str(REPO / ".venv" / "bin" / "turnwire")
WEBHOOK_SECRET_ENV = "CONFORMANCE_WEBHOOK_SECRET"
WEBHOOK_SECRET = "whsec_Y29uZm9ybWFuY2Ugc3VpdGUgdGVzdCBzZWNyZXQgb25seQ=="
START_TIMEOUT = 120.0  # seconds, a deadline: `make test` starts this runner beside pytest's workers, and
# a loaded 2-core machine took ~60 s to bring the sidecar up (CI, 2026-12-07)
WAIT_TIMEOUT = 20.0  # seconds: for `eventually` steps and background waits
# Reconnect every 0.1-0.5 s while the sidecar starts (gRPC's default backoff grows to 120 s and
# found a slow start past START_TIMEOUT); the runner needs only the client, so the server's
# turnwire_server.health_check.STARTING_SERVER_OPTIONS is spelled out here.
_STARTING_SERVER_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
_MISSING = object()


class CaseFailure(Exception):
    """A case's expectation did not hold; the message says where."""


# -- sidecar ------------------------------------------------------------------------------


class Sidecar:
    """A ``turnwire serve`` process on a free port with a throwaway SQLite store."""

    def __init__(self, config_path: Path) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="turnwire-conformance-py-")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNWIRE_")}
        env["TURNWIRE_LIMITS__DRAIN_SECONDS"] = "0"  # nothing to drain from: stop at once
        # configs/webhooks.json signs with it (a test value, public like the rest of the suite).
        env.setdefault(WEBHOOK_SECRET_ENV, WEBHOOK_SECRET)
        self.log = open(Path(self.dir.name) / "turnwire.log", "wb")  # noqa: SIM115 - closed in stop
        self.process = subprocess.Popen(
            [
                TURNWIRE_BIN,
                "serve",
                "--listen",
                self.address,
                "--config",
                str(config_path),
                "--store",
                f"sqlite:///{self.dir.name}/turnwire.db",
            ],
            cwd=self.dir.name,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def log_tail(self) -> str:
        """The last 3000 characters of the process's output."""
        return (Path(self.dir.name) / "turnwire.log").read_text(errors="replace")[-3000:]

    async def wait_serving(self) -> None:
        """Return once grpc.health.v1 answers SERVING; raise when the process exits first."""
        deadline = time.monotonic() + START_TIMEOUT
        async with grpc.aio.insecure_channel(self.address, options=_STARTING_SERVER_OPTIONS) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"turnwire exited while starting:\n{self.log_tail()}")
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"turnwire not SERVING after {START_TIMEOUT} s:\n{self.log_tail()}")
                await asyncio.sleep(0.05)  # the poll interval

    def stop(self) -> None:
        """SIGTERM, wait (SIGKILL after 20 s), remove the directory."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        self.dir.cleanup()


# -- matching (the same rules in every runner: see README.md) --------------------------------


def _is_default(value: Any) -> bool:
    return value in (False, 0, "", "0", [], {}) or (isinstance(value, str) and value.endswith("_UNSPECIFIED"))


def match(pattern: Any, actual: Any, path: str = "$") -> list[str]:
    """Mismatches of ``actual`` (proto JSON as plain values; ``_MISSING`` when absent) against
    ``pattern``: objects match by subset, lists by length and element, ``$nonempty`` /
    ``$absent`` test presence, ``{"$contains": [...]}`` finds each element somewhere in a list,
    an absent field matches a default pattern, numbers match their int64 strings (integers
    exactly). ``{"$json": pattern}`` (the kit suite's, clients/conformance/kits/SPEC.md) parses
    JSON text and matches the value."""
    if pattern == "$nonempty":
        return (
            []
            if actual is not _MISSING and not _is_default(actual)
            else [f"{path}: expected a value, got {actual!r}"]
        )
    if isinstance(pattern, dict) and set(pattern) == {"$json"}:
        if not isinstance(actual, str):
            return [f"{path}: expected JSON text, got {actual!r}"]
        try:
            parsed = json.loads(actual)  # integers of any size exactly
        except ValueError as error:
            return [f"{path}: not JSON ({error}): {actual!r}"]
        return match(pattern["$json"], parsed, f"{path}<json>")
    if pattern == "$absent":
        return (
            [] if actual is _MISSING or _is_default(actual) else [f"{path}: expected nothing, got {actual!r}"]
        )
    if actual is _MISSING:
        if _is_default(pattern) or (isinstance(pattern, dict) and not pattern):
            return []
        if isinstance(pattern, dict) and "$contains" not in pattern:
            actual = {}
        elif isinstance(pattern, list):
            actual = []
        else:
            return [f"{path}: expected {pattern!r}, field absent"]
    if isinstance(pattern, dict):
        if "$contains" in pattern:
            if not isinstance(actual, list):
                return [f"{path}: expected a list, got {actual!r}"]
            return [
                f"{path}: no element matches {wanted!r}"
                for wanted in pattern["$contains"]
                if not any(not match(wanted, item) for item in actual)
            ]
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {actual!r}"]
        problems: list[str] = []
        for key, wanted in pattern.items():
            problems += match(wanted, actual.get(key, _MISSING), f"{path}.{key}")
        return problems
    if isinstance(pattern, list):
        if not isinstance(actual, list) or len(actual) != len(pattern):
            return [f"{path}: expected {len(pattern)} elements, got {actual!r}"]
        problems = []
        for index, (wanted, item) in enumerate(zip(pattern, actual, strict=True)):
            problems += match(wanted, item, f"{path}[{index}]")
        return problems
    if pattern == actual and type(pattern) is type(actual):
        return []
    if _number(pattern) is not None and _number(pattern) == _number(actual):
        return []
    return [f"{path}: expected {pattern!r}, got {actual!r}"]


def _number(value: Any) -> int | float | None:
    """A JSON number, or an int64 in its proto JSON string form (an exact ``int``); else None.
    Integers stay exact: 2^53 + 1 never matches 2^53."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    return None


def kinds_match(pattern: Sequence[str], kinds: Sequence[str]) -> bool:
    """Whether the event kinds fit the pattern: each entry a kind, with ``+``, ``*`` or ``?``."""
    regex = "".join(
        f"(?:{re.escape(entry.rstrip('+*?'))},){entry[-1] if entry[-1] in '+*?' else ''}" for entry in pattern
    )
    return re.fullmatch(regex, "".join(f"{kind}," for kind in kinds)) is not None


def error_view(error: TurnwireError) -> dict[str, Any]:
    """A client error as the suite compares it: code, reason, metadata, violations, retry."""
    retry = False
    if error.status is not None:
        for detail in error.status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                retry = info.retry_delay.ToTimedelta().total_seconds() > 0
    return {
        "code": error.code.name if isinstance(error.code, grpc.StatusCode) else str(error.code),
        "reason": error.reason,
        "metadata": dict(error.error_metadata),
        "fieldViolations": [{"field": f, "description": d} for f, d in error.field_violations],
        "retryDelay": retry,
    }


def to_json(message: Any) -> Any:
    """Proto JSON (lowerCamelCase names, int64 as strings, enum names) as plain values."""
    return json_format.MessageToDict(message)


# -- calls ----------------------------------------------------------------------------------

_DISCONNECT = {"DISCONNECT_POLICY_CONTINUE": "continue"}


def _turn_options(request: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if request.get("requestId"):
        options["request_id"] = request["requestId"]
    if "body" in request:
        options["body"] = request["body"]
    if request.get("model"):
        options["model"] = request["model"]
    if "disconnectPolicy" in request:
        options["disconnect"] = _DISCONNECT.get(request["disconnectPolicy"], "cancel")
    if "clientTools" in request:
        options["client_tools"] = [
            json_format.ParseDict(tool, chat_service_pb2.ClientTool()) for tool in request["clientTools"]
        ]
    return options


def _messages(request: dict[str, Any]) -> list[message_pb2.Message]:
    return [json_format.ParseDict(m, message_pb2.Message()) for m in request.get("messages", [])]


def open_stream(client: TurnwireClient, rpc: str, request: dict[str, Any]) -> Any:
    """Start a turn-running RPC through the client's method for it."""
    conversation = request.get("conversationId", "")
    if rpc == "Chat":
        parts = request.get("message", {}).get("parts", [])
        text = "".join(part.get("text", {}).get("text", "") for part in parts)
        return client.chat(conversation, text, **_turn_options(request))
    if rpc == "SaveMessages":
        return client.save_messages(conversation, _messages(request), **_turn_options(request))
    if rpc == "ContinueLastTurn":
        return client.continue_last_turn(conversation, **_turn_options(request))
    if rpc == "ResumeTurn":
        return client.resume_turn(request["requestId"], int(request.get("afterSequenceNumber", 0)))
    if rpc == "WatchSubmission":
        return client.watch_submission(request["submissionId"], int(request.get("afterSequenceNumber", 0)))
    auto_continue = bool(request.get("autoContinue", False))
    if rpc == "SubmitToolResults":
        results = {
            r["toolCallId"]: json.loads(r.get("outputJson", "null"))
            for r in request["results"]
            if not r.get("error")
        }
        errors = {r["toolCallId"]: r.get("errorText", "") for r in request["results"] if r.get("error")}
        return client.submit_tool_results(
            conversation, results, errors=errors, auto_continue=auto_continue, **_turn_options(request)
        )
    if rpc == "SubmitToolApprovals":
        approvals = {a["toolCallId"]: bool(a.get("approved", False)) for a in request["approvals"]}
        reasons = {a["toolCallId"]: a["reason"] for a in request["approvals"] if a.get("reason")}
        return client.submit_tool_approvals(
            conversation, approvals, reasons=reasons, auto_continue=auto_continue, **_turn_options(request)
        )
    raise CaseFailure(f"unknown streaming RPC {rpc}")


async def call_unary(client: TurnwireClient, rpc: str, request: dict[str, Any]) -> Any:
    """Run a unary RPC through the client's method for it; its result as the RPC's response JSON."""
    if rpc == "GetConversation":
        conversation = await client.get_conversation(request.get("conversationId", ""))
        return {"conversation": to_json(conversation)}
    if rpc == "ListConversations":
        conversations = await client.list_conversations(
            int(request.get("pageSize", 0)), request.get("pageToken", "")
        )
        return to_json(conversations)
    if rpc == "ListTurns":
        turns = await client.list_turns(
            request.get("conversationId", ""),
            int(request.get("pageSize", 0)),
            request.get("pageToken", ""),
            failed_only=bool(request.get("failedOnly", False)),
        )
        return to_json(turns)
    if rpc == "CancelChat":
        return {"cancelled": await client.cancel_chat(request.get("requestId", ""))}
    if rpc == "DeleteConversation":
        deleted = await client.delete_conversation(
            request.get("conversationId", ""),
            allow_missing=bool(request.get("allowMissing", False)),
            include_forks=bool(request.get("includeForks", False)),
        )
        return {"deleted": deleted}
    if rpc == "ForkConversation":
        fork = await client.fork_conversation(
            request.get("conversationId", ""),
            request.get("atMessageId", ""),
            new_conversation_id=request.get("newConversationId", ""),
        )
        return {"conversation": to_json(fork)}
    if rpc == "AddMessages":
        added = await client.add_messages(
            request.get("conversationId", ""),
            _messages(request),
            upsert=request.get("mode") == "ADD_MODE_UPSERT",
            allow_missing=bool(request.get("allowMissing", False)),
        )
        return to_json(added)
    if rpc == "SubmitMessages":
        options: dict[str, Any] = {}
        for field, name in (
            ("submissionId", "submission_id"),
            ("idempotencyKey", "idempotency_key"),
            ("metadata", "metadata"),
            ("body", "body"),
            ("model", "model"),
            ("webhook", "webhook"),
        ):
            if request.get(field):
                options[name] = request[field]
        response = await client.submit_messages(
            request.get("conversationId", ""), _messages(request), **options
        )
        return to_json(response)
    if rpc == "GetSubmission":
        return {"submission": to_json(await client.get_submission(request.get("submissionId", "")))}
    if rpc == "ListSubmissions":
        page = await client.list_submissions(
            conversation_id=request.get("conversationId", ""),
            state=chat_service_pb2.SubmissionState.Value(
                request.get("state", "SUBMISSION_STATE_UNSPECIFIED")
            ),
            page_size=int(request.get("pageSize", 0)),
            page_token=request.get("pageToken", ""),
        )
        return to_json(page)
    if rpc == "ListWebhookDeliveries":
        deliveries = await client.list_webhook_deliveries(
            submission_id=request.get("submissionId", ""),
            conversation_id=request.get("conversationId", ""),
            state=webhook_pb2.WebhookDeliveryState.Value(
                request.get("state", "WEBHOOK_DELIVERY_STATE_UNSPECIFIED")
            ),
            page_size=int(request.get("pageSize", 0)),
            page_token=request.get("pageToken", ""),
        )
        return to_json(deliveries)
    if rpc == "CancelSubmission":
        return {"submission": to_json(await client.cancel_submission(request.get("submissionId", "")))}
    if rpc in _SCHEDULE_CALLS:
        return await _schedule_call(client, rpc, request)
    raise CaseFailure(f"unknown unary RPC {rpc}")


_SCHEDULE_CALLS = {
    "CreateSchedule",
    "GetSchedule",
    "ListSchedules",
    "PauseSchedule",
    "ResumeSchedule",
    "DeleteSchedule",
}
_OVERLAP = {chat_service_pb2.SCHEDULE_OVERLAP_POLICY_ENQUEUE: "enqueue"}
_MISSED = {chat_service_pb2.MISSED_RUNS_POLICY_RUN_ONCE: "run_once"}


async def _schedule_call(client: TurnwireClient, rpc: str, request: dict[str, Any]) -> Any:
    """The schedule RPCs through the client's schedule methods."""
    schedule_id = request.get("scheduleId", "")
    if rpc == "CreateSchedule":
        parsed = json_format.ParseDict(request, chat_service_pb2.CreateScheduleRequest())
        spec, given = parsed.schedule, parsed.schedule.input
        created = await client.create_schedule(
            given.conversation_id,
            list(given.messages),
            cron=spec.cron,
            time_zone=spec.time_zone,
            fire_time=spec.fire_time.ToDatetime(dt.UTC) if spec.HasField("fire_time") else None,
            conversation_id_template=spec.conversation_id_template,
            overlap=_OVERLAP.get(spec.overlap_policy, "skip"),
            missed_runs=_MISSED.get(spec.missed_runs_policy, "skip"),
            schedule_id=parsed.schedule_id,
            model=given.model or None,
        )
        return {"schedule": to_json(created)}
    if rpc == "ListSchedules":
        page = await client.list_schedules(
            page_size=int(request.get("pageSize", 0)), page_token=request.get("pageToken", "")
        )
        return to_json(page)
    if rpc == "DeleteSchedule":
        deleted = await client.delete_schedule(
            schedule_id, allow_missing=bool(request.get("allowMissing", False))
        )
        return {"deleted": deleted}
    method = {
        "GetSchedule": client.get_schedule,
        "PauseSchedule": client.pause_schedule,
        "ResumeSchedule": client.resume_schedule,
    }[rpc]
    return {"schedule": to_json(await method(schedule_id))}


STREAMING = {
    "Chat",
    "SaveMessages",
    "ContinueLastTurn",
    "ResumeTurn",
    "WatchSubmission",
    "SubmitToolResults",
    "SubmitToolApprovals",
}


class StreamOutcome:
    """What a turn-running call returned: its events, and the error that ended it, if any."""

    def __init__(self) -> None:
        self.events: list[event_pb2.TurnEvent] = []
        self.error: TurnwireError | None = None
        self.cancelled_by_client = False


async def read_stream(client: TurnwireClient, step: dict[str, Any]) -> StreamOutcome:
    """Run a streaming step to its end (or cancel it after ``cancel_after_events`` events)."""
    outcome = StreamOutcome()
    stream = open_stream(client, step["call"], step.get("request", {}))
    limit = step.get("cancel_after_events")
    try:
        async for event in stream:
            outcome.events.append(event)
            if limit is not None and len(outcome.events) >= limit:
                stream.cancel()  # client-side cancel: leave the call
                outcome.cancelled_by_client = True
                break
    except TurnwireError as error:
        outcome.error = error
    return outcome


def check_stream(step: dict[str, Any], outcome: StreamOutcome) -> list[str]:
    """The step's expectations and the stream rules every turn stream keeps."""
    expect = step.get("expect", {})
    problems: list[str] = []
    events = outcome.events
    kinds = [e.WhichOneof("event") or "" for e in events]
    # Stream rules: one request id, sequence numbers without gaps, TurnEnd exactly once and last.
    first = int(step.get("request", {}).get("afterSequenceNumber", 0))
    if events and len({e.request_id for e in events}) != 1:
        problems.append(f"events carry several request ids: {sorted({e.request_id for e in events})}")
    numbers = [e.sequence_number for e in events]
    if events and kinds[0] != "turn_end" and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        problems.append(f"sequence numbers not consecutive: {numbers}")
    if events and first and kinds[0] != "turn_end" and numbers[0] != first + 1:
        problems.append(f"resumed stream starts at {numbers[0]}, not {first + 1}")
    complete = outcome.error is None and not outcome.cancelled_by_client
    if complete and (kinds.count("turn_end") != 1 or kinds[-1] != "turn_end"):
        problems.append(f"a complete stream ends with exactly one turn_end: {kinds}")
    if "events" in expect and not kinds_match(expect["events"], kinds):
        problems.append(f"event kinds {kinds} do not fit {expect['events']}")
    if "error" in expect:
        if outcome.error is None:
            problems.append(f"expected the call to fail with {expect['error']}, it ended with {kinds}")
        else:
            problems += match(expect["error"], error_view(outcome.error), "error")
    elif outcome.error is not None:
        problems.append(f"the call failed: {outcome.error}")
    end = events[-1].turn_end if events and kinds[-1] == "turn_end" else None
    if "status" in expect:
        status = (
            event_pb2.TurnStatus.Name(end.status).removeprefix("TURN_STATUS_") if end else "(no turn_end)"
        )
        if status != expect["status"]:
            problems.append(f"status {status}, expected {expect['status']}")
    if "turnError" in expect:
        if end is None or not end.HasField("error"):
            problems.append("expected TurnEnd.error, there is none")
        else:
            problems += match(
                expect["turnError"], error_view(TurnwireError.from_status(end.error)), "turnError"
            )
    if "turnEnd" in expect:
        problems += match(expect["turnEnd"], to_json(end) if end else _MISSING, "turnEnd")
    for kind, pattern in expect.get("firstOf", {}).items():
        found = next((e for e, k in zip(events, kinds, strict=True) if k == kind), None)
        problems += match(pattern, to_json(getattr(found, kind)) if found else _MISSING, f"firstOf.{kind}")
    for kind, pattern in expect.get("everyOf", {}).items():  # the kit suite's (kits/SPEC.md)
        found = [to_json(getattr(e, kind)) for e, k in zip(events, kinds, strict=True) if k == kind]
        problems += match(pattern, found, f"everyOf.{kind}")
    if "text" in expect:
        text = "".join(e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta")
        if text != expect["text"]:
            problems.append(f"text deltas join to {text!r}, expected {expect['text']!r}")
    return problems


ExtraStep = Callable[[dict[str, Any]], Awaitable[list[str] | None]]
"""Another suite's steps (the kit suite's): the problems of a step it handles, None for others."""


async def run_case(client: TurnwireClient, case: dict[str, Any], extra: ExtraStep | None = None) -> None:
    """Run a case's steps in order; raise CaseFailure at the first unmet expectation."""
    background: dict[str, tuple[asyncio.Task[StreamOutcome], dict[str, Any], StreamOutcome]] = {}
    for index, step in enumerate(case["steps"]):
        where = f"step {index + 1}"
        handled = None if extra is None else await extra(step)
        if handled is not None:
            if handled:
                raise CaseFailure(f"{where} ({next(iter(step))}): " + "; ".join(handled))
            continue
        if "wait" in step:
            live = background[step["wait"]][2]
            wanted: int = step["events"]
            await poll(lambda: len(live.events) >= wanted, f"{where}: {wanted} events")  # noqa: B023 - awaited here
            continue
        if "await" in step:
            task, started, _ = background.pop(step["await"])
            outcome = await asyncio.wait_for(task, WAIT_TIMEOUT)
            problems = check_stream({**started, "expect": step.get("expect", {})}, outcome)
        elif step["call"] in STREAMING:
            if "background" in step:
                live = StreamOutcome()
                task = asyncio.create_task(read_into(client, step, live))
                background[step["background"]] = (task, step, live)
                continue
            problems = check_stream(step, await read_stream(client, step))
        else:
            problems = await check_unary(client, step)
        if problems:
            raise CaseFailure(f"{where} ({step.get('call') or step.get('await')}): " + "; ".join(problems))
    for name, (task, _, _) in background.items():
        task.cancel()
        raise CaseFailure(f"background call {name!r} never awaited")


async def read_into(client: TurnwireClient, step: dict[str, Any], outcome: StreamOutcome) -> StreamOutcome:
    """read_stream, filling ``outcome`` as events arrive (so ``wait`` steps can see them)."""
    stream = open_stream(client, step["call"], step.get("request", {}))
    try:
        async for event in stream:
            outcome.events.append(event)
    except TurnwireError as error:
        outcome.error = error
    return outcome


async def check_unary(client: TurnwireClient, step: dict[str, Any]) -> list[str]:
    """Call a unary step (again and again until it matches, for ``eventually``)."""
    expect = step.get("expect", {})
    deadline = time.monotonic() + (WAIT_TIMEOUT if step.get("eventually") else 0)
    while True:
        try:
            response: Any = await call_unary(client, step["call"], step.get("request", {}))
            problems = (
                [f"expected the call to fail with {expect['error']}, it answered {response}"]
                if "error" in expect
                else match(expect.get("response", {}), response, "response")
            )
        except TurnwireError as error:
            problems = (
                match(expect["error"], error_view(error), "error")
                if "error" in expect
                else [f"the call failed: {error}"]
            )
        if not problems or time.monotonic() > deadline:
            return problems
        await asyncio.sleep(0.05)  # the poll interval of `eventually`


async def poll(condition: Callable[[], bool], what: str) -> None:
    """Return once ``condition()`` holds; CaseFailure after WAIT_TIMEOUT."""
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise CaseFailure(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)  # the poll interval


# -- main -----------------------------------------------------------------------------------


def load_cases(names: list[str]) -> list[dict[str, Any]]:
    """The case files in name order (only ``names`` when given)."""
    cases = [json.loads(path.read_text()) for path in sorted((SUITE / "cases").glob("*.json"))]
    return [case for case in cases if not names or case["name"] in names]


async def main(names: list[str]) -> int:
    """Run the cases; the process's exit code."""
    cases = load_cases(names)
    passed = failed = 0
    for config in dict.fromkeys(case["config"] for case in cases):
        sidecar = Sidecar(SUITE / "configs" / f"{config}.json")
        try:
            await sidecar.wait_serving()
            async with TurnwireClient(sidecar.address) as client:
                for case in (c for c in cases if c["config"] == config):
                    try:
                        await asyncio.wait_for(run_case(client, case), 60)
                    except (CaseFailure, TimeoutError, TurnwireError) as failure:
                        failed += 1
                        print(f"FAIL {case['name']}: {failure or 'timed out'}")
                    else:
                        passed += 1
                        print(f"ok   {case['name']}")
        finally:
            sidecar.stop()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not cases else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
