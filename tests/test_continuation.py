"""Continuing a reply (docs/semantics.md §1, "Continuing a reply"; issue 30 item 8): reasoning at the end
of the last assistant message is not sent, the continuation prompt follows only text or a file, and a
reply with nothing else is left out, so the model is never asked to continue what it cannot see."""

from __future__ import annotations

from support.engine_harness import CONV, EngineFactory, end_of, text_of

from turnwire.providers import CONTINUATION_PROMPT
from turnwire.testing import ScriptedError, ScriptedProvider, ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.continuation import continued


def _message(role: message_pb2.Role.ValueType, *kinds: str) -> message_pb2.Message:
    """A message of parts named by kind: ``step``, ``text``, ``reasoning``, ``call``, ``file``."""
    message = message_pb2.Message(id=f"m-{'-'.join(kinds)}", role=role)
    for kind in kinds:
        part = message.parts.add()
        if kind == "step":
            part.step_start.SetInParent()
        elif kind == "text":
            part.text.text = "Paris is"
        elif kind == "reasoning":
            part.reasoning.text = "Think."
            part.reasoning.signature = b"sig"
        elif kind == "call":
            part.tool_call.tool_call_id = "c1"
            part.tool_call.tool_name = "t"
            part.tool_call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        elif kind == "file":
            part.file.media_type = "image/png"
            part.file.data = b"png"
    return message


def _user() -> message_pb2.Message:
    return _message(message_pb2.ROLE_USER, "text")


def _assistant(*kinds: str) -> message_pb2.Message:
    return _message(message_pb2.ROLE_ASSISTANT, *kinds)


def _shape(messages: list[message_pb2.Message]) -> list[tuple[str, list[str]]]:
    role = {message_pb2.ROLE_USER: "user", message_pb2.ROLE_ASSISTANT: "assistant"}
    return [
        (
            "prompt" if m.id == "continuation-prompt" else role[m.role],
            [str(p.WhichOneof("kind")) for p in m.parts],
        )
        for m in messages
    ]


def test_trailing_reasoning_after_text_is_cut_and_the_prompt_follows() -> None:
    reply = _assistant("step", "text", "step", "reasoning")
    sent = continued([_user(), reply])
    assert _shape(sent) == [("user", ["text"]), ("assistant", ["step_start", "text"]), ("prompt", ["text"])]
    assert text_of(sent[-1]) == CONTINUATION_PROMPT
    assert len(reply.parts) == 4  # the stored message is not changed


def test_trailing_reasoning_after_tool_results_is_cut_and_no_prompt_follows() -> None:
    sent = continued([_user(), _assistant("step", "reasoning", "call", "step", "reasoning")])
    assert _shape(sent) == [("user", ["text"]), ("assistant", ["step_start", "reasoning", "tool_call"])]


def test_a_reasoning_only_reply_is_left_out() -> None:
    """The model answers the user message instead of being asked to continue a reply it cannot see."""
    user = _user()
    assert continued([user, _assistant("step", "reasoning", "step")]) == [user]


def test_replies_that_end_in_content_get_the_prompt_unchanged() -> None:
    for kinds in (("step", "text"), ("step", "reasoning", "text"), ("step", "file")):
        reply = _assistant(*kinds)
        sent = continued([_user(), reply])
        assert sent[1] is reply  # not copied
        assert _shape(sent)[-1] == ("prompt", ["text"])


def test_histories_that_end_with_a_user_message_or_tool_results_are_left_as_they_are() -> None:
    for history in ([_user()], [_user(), _assistant("step", "call")], []):
        assert continued(list(history)) == history


def test_a_lone_reasoning_only_message_is_kept() -> None:
    """Nothing precedes it: leaving it out would leave no message at all."""
    reply = _assistant("step", "reasoning")
    assert continued([reply]) == [reply]


async def test_continue_last_turn_after_a_reasoning_only_partial_answers_the_question(
    make_engine: EngineFactory,
) -> None:
    """A step failed after its reasoning (nothing else streamed): the partial is stored; the
    continuation's request is the question alone, without the reply or the continuation prompt."""
    failing = ScriptStep(
        reasoning="Let me think.",
        text="unseen",
        chunk_size=100,
        error=ScriptedError(message="boom", after_chunks=2),
    )
    h = await make_engine(scripts={"main": [failing]})
    first = end_of(await h.run("What is 17 x 23?", request_id="r-first", message_id="u-first"))
    assert first.status == event_pb2.TURN_STATUS_ERROR
    stored = await h.store.load_messages(CONV)
    assert [p.WhichOneof("kind") for p in stored[-1].parts] == ["step_start", "reasoning"]
    h.provider.inner.scripts["main"] = ScriptedProvider({"x": [ScriptStep(text="391.")]}).scripts["x"]

    end = end_of(await h.run(None, request_id="r-cont", continuation=True))

    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    sent = h.provider.requests[-1].messages
    assert [m.id for m in sent] == ["u-first"]
    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == ["u-first", "tw-a-r-first", "tw-a-r-cont"]
    assert stored[1].parts[-1].reasoning.text == "Let me think."  # the partial is kept as stored
    assert text_of(stored[2]) == "391."
