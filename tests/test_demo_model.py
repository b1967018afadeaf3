"""The offline demo model (``scripted:demo``) asked to continue its last reply.

A fresh-user trial ran ``turnwire continue`` in the demo and got the engine's continuation prompt
echoed back as if the user had said it ("You said: 'Continue your previous response …'"). The
prompt is the engine's, not the user's: the demo writes the rest of a reply that was cut off, or
says the reply was complete.
"""

from __future__ import annotations

from support.engine_harness import CONV, EngineFactory, end_of, text_of

from turnwire.providers import CONTINUATION_PROMPT, ModelRequest
from turnwire.testing import OFFLINE_NOTICE, DemoScript
from turnwire.types import ToolDefinition
from turnwire_client.v1 import event_pb2, message_pb2


def _message(role: message_pb2.Role.ValueType, text: str, message_id: str) -> message_pb2.Message:
    """A message of one step: a step start, then ``text``."""
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().step_start.SetInParent()
    message.parts.add().text.text = text
    return message


def _request(messages: list[message_pb2.Message], tools: tuple[str, ...]) -> ModelRequest:
    definitions = [
        ToolDefinition(name=name, description="", input_schema={"type": "object"}) for name in tools
    ]
    return ModelRequest(model="demo", system="", messages=messages, tools=definitions)


def _user(text: str, message_id: str = "u1") -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


def _continue(question: str, written: str, tools: tuple[str, ...] = ()) -> ModelRequest:
    """The request the engine sends to continue the reply ``written`` to ``question``."""
    reply = _message(message_pb2.ROLE_ASSISTANT, written, "a1")
    return _request([_user(question), reply, _user(CONTINUATION_PROMPT, "continuation-prompt")], tools)


def _answer(question: str, tools: tuple[str, ...] = ()) -> str:
    return DemoScript().step(_request([_user(question)], tools)).text


def test_a_complete_reply_is_not_continued_with_the_prompt_echoed() -> None:
    whole = _answer("hello there")
    step = DemoScript().step(_continue("hello there", whole))
    assert CONTINUATION_PROMPT not in step.text and "You said" not in step.text
    assert step.text.startswith(OFFLINE_NOTICE) and "nothing to continue" in step.text
    assert not step.tool_calls


def test_a_reply_cut_off_is_completed_from_where_it_stopped() -> None:
    whole = _answer("hello there")
    step = DemoScript().step(_continue("hello there", whole[:30]))
    assert step.text == whole[30:]


def test_a_reply_cut_off_before_its_tool_call_makes_the_call() -> None:
    tools = ("get_weather",)
    whole = _answer("What's the weather in Oslo?", tools)
    step = DemoScript().step(_continue("What's the weather in Oslo?", whole[:10], tools))
    assert step.text == whole[10:]
    assert [(call.name, call.input) for call in step.tool_calls] == [("get_weather", {"city": "Oslo"})]


async def test_continue_last_turn_on_the_demo_model(make_engine: EngineFactory) -> None:
    """Through the engine, as ``turnwire continue`` runs it: the stored continuation does not
    quote the prompt."""
    h = await make_engine()
    first = await h.run("hello there", model="scripted:demo")
    assert end_of(first).status == event_pb2.TURN_STATUS_COMPLETED
    events = await h.run(None, continuation=True, model="scripted:demo")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    stored = await h.store.load_messages(CONV)
    reply = text_of(stored[-1])
    assert "Continue your previous response" not in reply and "nothing to continue" in reply
