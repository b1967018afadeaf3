"""What a step sends when the history ends with an assistant reply (docs/semantics.md §1, "Continuing
a reply").

A continuation (``ContinueLastTurn``, ``SaveMessages`` with no messages after a reply, a recovery
that appends to an interrupted reply) has the model go on after the last assistant message. The
model can go on only from what it sees of that message:

- Reasoning at its end, with no output after it (a step that failed or was cut off while or just
  after the model reasoned), is not sent: no API continues a reasoning block, and the APIs drop
  or refuse reasoning that led to nothing (a Responses reasoning item needs the item that
  followed it; Anthropic ignores thinking outside the current tool loop). The stored message
  keeps it; only the request leaves it out.
- What is left ends in text or a file: the request gets the continuation prompt
  (:data:`turnwire.providers.CONTINUATION_PROMPT`, never stored) after it.
- It ends in tool calls with their results: those results are the model's next input, no prompt.
- Nothing is left: the message is left out, so the model answers the messages before it instead
  of being asked to continue a reply it cannot see.
"""

from __future__ import annotations

from turnwire.providers import CONTINUATION_PROMPT
from turnwire_client.v1 import message_pb2

_UNSEEN = frozenset({"step_start", "reasoning"})
"""Parts that give the model nothing to continue from when they end a reply."""


def continued(out: list[message_pb2.Message]) -> list[message_pb2.Message]:
    """The history ``out`` (oldest first; a list of the caller's own, changed in place and returned;
    its messages are shared and never changed) as a model request sends it: when the last is an
    assistant message, without its trailing reasoning and followed by the continuation prompt when
    it ends in content, or left out when it holds nothing else (see the module docstring). Other
    histories are left as they are."""
    if not out or out[-1].role != message_pb2.ROLE_ASSISTANT:
        return out
    last = out[-1]
    parts = last.parts
    end = len(parts)
    while end and parts[end - 1].WhichOneof("kind") in _UNSEEN:
        end -= 1
    if end < len(parts):
        if not any(part.WhichOneof("kind") != "step_start" for part in parts[:end]):
            # Nothing the model could see: it answers what came before (unless nothing did).
            if len(out) > 1:
                out.pop()
            return out
        trimmed = message_pb2.Message()
        trimmed.CopyFrom(last)
        del trimmed.parts[end:]
        out[-1] = last = trimmed
    if _ends_in_content(last):
        out.append(_continuation_prompt())
    return out


def _continuation_prompt() -> message_pb2.Message:
    """The user message that asks the model to go on with its reply (never stored)."""
    prompt = message_pb2.Message(id="continuation-prompt", role=message_pb2.ROLE_USER)
    prompt.parts.add().text.text = CONTINUATION_PROMPT
    return prompt


def _ends_in_content(message: message_pb2.Message) -> bool:
    """True when the last part (step markers aside) is text, reasoning or a file: a reply cut off
    mid-answer, not one waiting on tool results."""
    for part in reversed(message.parts):
        kind = part.WhichOneof("kind")
        if kind != "step_start":
            return kind != "tool_call"
    return False
