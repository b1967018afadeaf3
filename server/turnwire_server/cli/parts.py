"""How the parts of a reply print, live (:mod:`.live`) and from the store (:mod:`.history`):
tool calls and their results, sources, files; JSON shown exactly and cut short; styles by status.

Lines are rich ``Text`` without markup, so a model's text is never read as markup; output that is
not a terminal stays plain text.
"""

from __future__ import annotations

import json
from datetime import UTC

from google.protobuf import json_format, timestamp_pb2
from rich.console import Console
from rich.text import Text

from turnwire.errors import ABORTED_TOOL_ERROR, INTERRUPTED_TOOL_ERROR
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.cli.connection import command_name

_MAX_JSON = 300  # characters of tool input/output shown before eliding

STATUS_STYLES: dict[int, str] = {
    event_pb2.TURN_STATUS_COMPLETED: "bold green",
    event_pb2.TURN_STATUS_ERROR: "bold red",
    event_pb2.TURN_STATUS_ABORTED: "bold yellow",
    event_pb2.TURN_STATUS_INTERRUPTED: "bold yellow",
    event_pb2.TURN_STATUS_SKIPPED: "bold",
}


def approval_hint(conversation: str, call_id: str, where: str = "") -> str:
    """Who answers a call waiting for approval: the CLI's ``approve`` (applications:
    SubmitToolApprovals), as a command to run as it stands (``where``: :func:`.connection.target_flag`)."""
    return (
        f" (call {call_id}: `{command_name()} approve {conversation} {call_id}{where}`, or add --deny"
        " [--reason TEXT]; the turn goes on)"
    )


def responded_hint(conversation: str, where: str = "") -> str:
    """A call whose approval was answered but whose turn did not go on (``approval-responded``): the
    next turn runs it (``continue``), where ``approve`` would refuse it as no longer pending."""
    return f"approved, not run yet (run it and go on: `{command_name()} continue {conversation}{where}`)"


def call_line(name: str, payload: str, *, style: str = "") -> Text:
    return Text.assemble(("→ ", "cyan"), (name, "bold cyan"), " ", (payload, style))


def result_line(
    name: str,
    output_json: str,
    decision: message_pb2.ToolCallDecision.ValueType = message_pb2.TOOL_CALL_DECISION_UNSPECIFIED,
) -> Text:
    """``← name: output``; a result a ``before_tool_call`` hook decided is marked as such (the
    model took it as a success, but the tool did not run)."""
    payload = exact_json(output_json)
    if decision == message_pb2.TOOL_CALL_DECISION_BLOCKED:
        value = json.loads(output_json) if output_json else None
        shown = value if isinstance(value, str) else payload
        return Text.assemble(
            ("← ", "yellow"), (name, "bold yellow"), (": blocked by a hook: ", "yellow"), shown
        )
    line = Text.assemble(("← ", "green"), (name, "bold green"), ": ", payload)
    if decision == message_pb2.TOOL_CALL_DECISION_SUBSTITUTED:
        line.append(" (substituted by a hook; the tool did not run)", style="yellow")
    return line


def preliminary_line(name: str, output_json: str) -> Text:
    payload = exact_json(output_json)
    return Text.assemble(("… ", "dim"), (name, "bold dim"), ": ", (payload, "dim"), (" (preliminary)", "dim"))


_STOPPED_TOOL_CALLS: dict[str, str] = {
    ABORTED_TOOL_ERROR: "aborted before it finished (the turn stopped)",
    INTERRUPTED_TOOL_ERROR: "interrupted: no result was recorded",
}
"""The sidecar's results for calls the turn stopped, not the tool failing: shown apart from errors."""


def denied_line(name: str, reason: str) -> Text:
    """``← name: denied`` (yellow), with the reason given when there is one."""
    return Text(f"← {name}: denied" + (f" ({reason})" if reason else ""), style="yellow")


def error_line(name: str, error_text: str) -> Text:
    """``← name: error: text`` (red); a call the turn stopped is shown as such (yellow), as
    blocked and denied calls are, not as the tool's failure."""
    stopped = _STOPPED_TOOL_CALLS.get(error_text)
    if stopped is not None:
        word, _, rest = stopped.partition(" ")
        return Text.assemble(
            ("← ", "yellow"), (name, "bold yellow"), ": ", (word, "bold yellow"), (f" {rest}", "yellow")
        )
    return Text(f"← {name}: error: {error_text}", style="red")


def source_line(source: message_pb2.SourcePart) -> Text:
    """``[source] title url-or-media  "cited text"  (pages 3-3 of document 1)``: one line per source,
    the cited passage shortened."""
    label = source.title or source.filename or source.source_id
    where = source.url or source.provider_file_id or source.media_type
    bits = ["[source]", label, where]
    if source.cited_text:
        bits.append(f'"{short(" ".join(source.cited_text.split()), 80)}"')
    if source.HasField("location"):
        bits.append(f"({_location(source.location)})")
    return Text(" ".join(s for s in bits if s), style="dim")


_UNITS = {
    message_pb2.SOURCE_LOCATION_UNIT_CHARACTER: "characters",
    message_pb2.SOURCE_LOCATION_UNIT_PAGE: "pages",
    message_pb2.SOURCE_LOCATION_UNIT_CONTENT_BLOCK: "blocks",
}


def _location(location: message_pb2.SourceLocation) -> str:
    """``pages 3-3 of document 1``: the range is inclusive for people (the proto's end is exclusive);
    pages are 1-based, characters and blocks 0-based, documents shown 1-based."""
    where = f"document {location.document_index + 1}"
    unit = _UNITS.get(location.unit)
    if unit is None:
        return where
    return f"{unit} {location.start}-{max(location.end - 1, location.start)} of {where}"


def file_line(file: message_pb2.FilePart) -> Text:
    """``[file] name media where``: its URL, its provider file id, or its size (also when its bytes
    were not kept)."""
    content = file.WhichOneof("content")
    if content == "url":
        where = file.url
    elif content == "provider_file_id":
        where = f"{file.provider_file_id} (kept by the provider)"
    elif content == "data":
        where = f"{len(file.data)} bytes"
    else:
        where = f"{file.size_bytes} bytes, not kept"
    bits = ("[file]", file.filename, file.media_type, where)
    return Text(" ".join(s for s in bits if s), style="dim")


def input_json(call: message_pb2.ToolCallPart | event_pb2.ToolInputAvailable) -> str:
    """The call's input for display: its exact JSON text, else (a sidecar before input_json
    existed) the deprecated Struct view."""
    if call.input_json:
        return exact_json(call.input_json)
    return short(sorted_json(json_format.MessageToDict(call.input)))


def exact_json(text: str) -> str:
    """A tool input or output from its exact JSON text (integers of any size kept), keys sorted
    so the same data always prints the same; ``null`` for an empty text."""
    if not text:
        return "null"
    return short(json.dumps(json.loads(text), ensure_ascii=False, sort_keys=True))


def sorted_json(value: object) -> str:
    # Struct maps have no order; sort keys so the same data always prints the same.
    return json.dumps(_plain(value), ensure_ascii=False, sort_keys=True)


def _plain(value: object) -> object:
    """Undo protobuf's number widening for display: ``21.0`` becomes ``21``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def short(text: str, limit: int = _MAX_JSON) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def or_stderr(console: Console | None) -> Console:
    """``console``, or a stderr ``Console`` when ``None``: where errors go."""
    return console if console is not None else Console(stderr=True)


def print_listing_end(out: Console, shown: int, more: bool, nothing: str) -> None:
    """A listing's last line: ``(nothing)`` when it showed none, a hint when more exist."""
    if shown == 0:
        out.print(Text(f"({nothing})", style="dim"), soft_wrap=True)
    elif more:
        out.print(Text(f"(more than {shown}; use --limit to see more)", style="dim"), soft_wrap=True)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def utc_time(stamp: timestamp_pb2.Timestamp) -> str:
    return stamp.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
