"""The scripted model's built-in scripts: ``demo`` (:class:`DemoScript`, the embedded default's
rules: a demo tool when one answers the question, then the answer) and ``summarizer``
(:class:`SummaryScript`, an extractive summary for compaction). Deterministic and offline; every
text they write says so (:data:`OFFLINE_NOTICE`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import orjson

from turnwire.compaction import SUMMARY_REQUEST_ID
from turnwire.providers import CONTINUATION_PROMPT, ModelRequest
from turnwire.scripted_steps import ScriptedToolCall, ScriptStep
from turnwire.types import last_step_text
from turnwire.values import tool_call_output
from turnwire_client.v1 import message_pb2

__all__ = ["BUILTIN_SCRIPTS", "OFFLINE_NOTICE", "DemoScript", "SummaryScript"]

OFFLINE_NOTICE = "[offline scripted model, no LLM connected]"
"""What every text of a built-in script starts with: no LLM answered."""

_ARITHMETIC = re.compile(r"[-\d(][\d\s.+\-*/()%×x]*[\d)]")
_OPERATOR = re.compile(r"\d\s*[-+*/%×x]\s*[-\d(]")
_WEATHER = re.compile(r"weather\s+(?:in|for|at)\s+([A-Za-zÀ-ÿ .'-]+?)(?:[?.!,]|$)", re.IGNORECASE)
_TIME = re.compile(r"\b(time|clock|date|today)\b", re.IGNORECASE)
_ZONE = re.compile(r"\b(?:in|for)\s+([A-Za-z]+/[A-Za-z_]+|UTC)\b")


def _text(message: message_pb2.Message) -> str:
    return " ".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


def _is_continuation_prompt(message: message_pb2.Message) -> bool:
    return message.role == message_pb2.ROLE_USER and _text(message) == CONTINUATION_PROMPT


def _last_user_text(messages: Sequence[message_pb2.Message]) -> str:
    for message in reversed(messages):
        if message.role == message_pb2.ROLE_USER:
            return _text(message)
    return ""


def _trailing_tool_results(
    messages: Sequence[message_pb2.Message],
) -> list[message_pb2.ToolCallPart]:
    """Tool calls with results in the current turn's assistant message (after its last step start)."""
    if not messages or messages[-1].role != message_pb2.ROLE_ASSISTANT:
        return []
    results: list[message_pb2.ToolCallPart] = []
    for part in messages[-1].parts:
        kind = part.WhichOneof("kind")
        if kind == "step_start":
            results = []
        elif kind == "tool_call" and part.tool_call.state in (
            message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
            message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
            message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
        ):
            results.append(part.tool_call)
    return results


class DemoScript:
    """The embedded default's rules: call a demo tool when one answers the question, then answer."""

    def step(self, request: ModelRequest) -> ScriptStep:
        """Decide the step from the transcript (deterministic); a compaction's summary request
        gets the :class:`SummaryScript`'s summary (so ``scripted:demo`` can summarize)."""
        if request.messages and request.messages[-1].id == SUMMARY_REQUEST_ID:
            return SummaryScript().step(request)
        if len(request.messages) >= 2 and _is_continuation_prompt(request.messages[-1]):
            return self._continue(request)
        tools = {t.name for t in request.tools}
        # Results end the history in a later step, or in a continuation after client results.
        results = _trailing_tool_results(request.messages)
        if results:
            return ScriptStep(text=self._answer(results))
        text = _last_user_text(request.messages)
        call = self._tool_call(text, tools)
        if call is not None and request.tool_choice != "none":
            return ScriptStep(text=f"{OFFLINE_NOTICE} Let me use the {call.name} tool.", tool_calls=[call])
        return ScriptStep(
            text=(
                f"{OFFLINE_NOTICE} You said: {text!r}. I can call the demo tools: "
                "ask me the time, the weather in a city, or to calculate 12 * 7."
            )
        )

    def _continue(self, request: ModelRequest) -> ScriptStep:
        """The step after the continuation prompt: the rest of the reply the prompt follows (the
        step this script gives for the history without the prompt, less the text already
        written: a reply cut off by a cancel or a crash is completed), else a note that the reply
        was complete (``turnwire continue`` after a finished answer)."""
        before = dataclasses.replace(request, messages=request.messages[:-1])
        written = last_step_text(before.messages[-1])
        whole = self.step(before)
        rest = whole.text[len(written) :] if whole.text.startswith(written) else ""
        if rest or (whole.tool_calls and whole.text.startswith(written)):
            return whole.model_copy(update={"text": rest})
        return ScriptStep(
            text=f"{OFFLINE_NOTICE} My previous reply was complete; there is nothing to continue. "
            "Ask me the time, the weather in a city, or to calculate 12 * 7."
        )

    @staticmethod
    def _tool_call(text: str, tools: set[str]) -> ScriptedToolCall | None:
        if (match := _WEATHER.search(text)) and "get_weather" in tools:
            return ScriptedToolCall(name="get_weather", input={"city": match.group(1).strip()})
        arithmetic = [m for m in _ARITHMETIC.findall(text) if _OPERATOR.search(m)]
        if arithmetic and "calculator" in tools:
            expression = max(arithmetic, key=len).strip().replace("x", "*").replace("×", "*")
            return ScriptedToolCall(name="calculator", input={"expression": expression})
        if _TIME.search(text) and "get_current_time" in tools:
            zone = _ZONE.search(text)
            return ScriptedToolCall(
                name="get_current_time", input={"timezone": zone.group(1) if zone else "UTC"}
            )
        return None

    @staticmethod
    def _answer(results: Sequence[message_pb2.ToolCallPart]) -> str:
        lines = []
        for result in results:
            if result.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
                lines.append(f"The {result.tool_name} tool failed: {result.error_text}")
                continue
            if result.state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
                lines.append(
                    f"The {result.tool_name} call was denied: {result.error_text or 'no reason given'}"
                )
                continue
            value = tool_call_output(result)
            lines.append(_describe_result(result.tool_name, value))
        return f"{OFFLINE_NOTICE} " + " ".join(lines)


def _describe_result(tool_name: str, value: Any) -> str:
    """A sentence about a demo tool's result (generic JSON for other tools)."""
    if isinstance(value, dict):
        if tool_name == "get_weather" and {"city", "condition", "temperature_c"} <= value.keys():
            return (
                f"In {value['city']} it is {value['condition']} and "
                f"{value['temperature_c']} °C (the tool's offline demo data)."
            )
        if tool_name == "calculator" and {"expression", "result"} <= value.keys():
            return f"{value['expression']} = {value['result']}."
        if tool_name == "get_current_time" and {"iso", "timezone"} <= value.keys():
            return f"It is {value['iso']} ({value.get('weekday', '')}) in {value['timezone']}."
    return f"The {tool_name} tool returned {orjson.dumps(value).decode()}."


class SummaryScript:
    """The built-in ``summarizer``: an extractive summary of the conversation it is sent (the
    first sentence of each message, the tools called), deterministic and offline, for
    ``SummarizeOlder(model="scripted:summarizer")``."""

    def step(self, request: ModelRequest) -> ScriptStep:
        """One text step summarizing every message but the last (the summary request)."""
        lines = []
        for message in request.messages[:-1]:
            role = "user" if message.role == message_pb2.ROLE_USER else "assistant"
            for part in message.parts:
                kind = part.WhichOneof("kind")
                if kind == "text" and part.text.text.strip():
                    first = re.split(r"(?<=[.!?])\s", part.text.text.strip(), maxsplit=1)[0]
                    lines.append(f"{role}: {first[:120]}")
                elif kind == "tool_call":
                    lines.append(f"{role} called {part.tool_call.tool_name}")
        return ScriptStep(text=f"{OFFLINE_NOTICE} " + "; ".join(lines or ["nothing yet"]))


BUILTIN_SCRIPTS = ("demo", "summarizer")
"""The scripts every :class:`ScriptedProvider` has unless the configuration overrides them."""
