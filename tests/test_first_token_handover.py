"""A turn's first token reaches its reader before the rest of the model's answer is worked
through (issue 33; engine/step_stream.py ``_first_token``, engine/channel.py ``taken``).

A model whose whole answer is already read (a short answer arrives in one read) yields its
chunks without the turn's task ever waiting; without the hand-over, the reader got the first
token only once the turn had worked through every chunk and finished the step.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from support.engine_harness import EngineFactory, collect, kinds

from turnwire.providers import ModelRequest
from turnwire.types import FinishReason, FinishStep, ModelChunk, TextDelta, TextEnd, TextStart, Usage


class ReadAtOnce:
    """A model whose four deltas are all there at once; it records, as it is asked for the second
    delta, which events the reader had received by then."""

    name = "at-once"

    def __init__(self) -> None:
        self.received: list[str] = []
        self.received_at_second: list[str] | None = None

    def has_model(self, model: str) -> bool:
        return True

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        yield TextStart("t0")
        yield TextDelta("t0", "one ")
        self.received_at_second = list(self.received)
        for word in ("two ", "three ", "four"):
            yield TextDelta("t0", word)
        yield TextEnd("t0")
        yield FinishStep(FinishReason.STOP, usage=Usage(input_tokens=1, output_tokens=4))

    async def aclose(self) -> None:
        return None


async def test_the_first_token_is_taken_by_the_reader_before_the_next_chunk_is_worked(
    make_engine: EngineFactory,
) -> None:
    model = ReadAtOnce()
    h = await make_engine(providers={"at-once": model})
    events = await collect(await h.start("hi", model="at-once:any"), on_event=model.received.append)
    assert model.received_at_second is not None
    assert "text_delta" in model.received_at_second, model.received_at_second
    assert kinds(events).count("text_delta") >= 1
    assert "".join(e.text_delta.delta for e in events if e.HasField("text_delta")) == "one two three four"
    assert kinds(events)[-1] == "turn_end"
    assert events[-1].turn_end.status == 1  # TURN_STATUS_COMPLETED


async def test_a_reader_that_takes_nothing_does_not_hold_the_turn(make_engine: EngineFactory) -> None:
    model = ReadAtOnce()
    h = await make_engine(providers={"at-once": model})
    handle = await h.start("hi", model="at-once:any")
    # Nobody reads the stream: the turn still finishes (the hand-over waits a bounded time).
    await handle.task
    assert model.received_at_second == []
    events = await collect(handle)
    assert kinds(events)[-1] == "turn_end"
