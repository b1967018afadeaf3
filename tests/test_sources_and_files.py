"""Sources and files through the engine (issue 31; docs/providers.md "What each API's parts become"):
each is streamed, stored with its tie to the text it supports, and given to ``on_step_finish``; a file
too large for the reply is kept by reference, with a warning, so the reply stays readable by any
client (docs/semantics.md §11).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from support.engine_harness import CONV, EngineFactory, collect, of_kind

from turnwire.hooks import Middleware, StepFinishContext
from turnwire.providers import ModelRequest
from turnwire.types import (
    File,
    FinishReason,
    FinishStep,
    ModelChunk,
    Source,
    SourceLocation,
    TextDelta,
    TextEnd,
    TextStart,
)
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.assistant_message import REPLY_BUDGET_BYTES

BIG = bytes(range(256)) * (REPLY_BUDGET_BYTES // 256 + 1024)  # over the whole reply budget
SMALL = b"\x89PNG\r\n\x1a\n" + b"\x00" * 100


class _Model:
    """Streams one cited text block, a large and a small generated file."""

    name = "parts"

    def has_model(self, model: str) -> bool:
        return True

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        yield TextStart("b1")
        yield TextDelta("b1", "The tower is 330 m tall.")
        yield Source(
            "src1",
            source_type="document",
            title="Notes",
            cited_text="330 metres",
            location=SourceLocation(document_index=0, unit="character", start=4, end=14),
            text_id="b1",
            text_span=(13, 23),
            provider_metadata={"anthropic": {"type": "char_location", "long": "x" * 10_000}},
        )
        yield TextEnd("b1")
        yield Source("src2", url="https://example.com", text_id="no-such-block")
        yield File(
            "image/png",
            data=BIG,
            provider_file_id="file-big",
            provider_metadata={"openai": {"item_id": "ig_1"}},
        )
        yield File("image/png", data=SMALL)
        yield FinishStep(FinishReason.STOP)

    async def aclose(self) -> None:
        return None


class _Steps(Middleware):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[StepFinishContext] = []

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.steps.append(ctx)


async def test_sources_and_files_are_streamed_stored_and_given_to_on_step_finish(
    make_engine: EngineFactory,
) -> None:
    recorder = _Steps()
    h = await make_engine(providers={"parts": _Model()}, middlewares=[recorder])
    events = await collect(await h.start("How tall?", model="parts:m"))
    assert events[-1].turn_end.status == 1, events[-1]
    (reply,) = [m for m in await h.store.load_messages(CONV) if m.role == message_pb2.ROLE_ASSISTANT]

    texts = [p.text for p in reply.parts if p.WhichOneof("kind") == "text"]
    assert [(t.id, t.text) for t in texts] == [("b1", "The tower is 330 m tall.")]
    sources = [p.source for p in reply.parts if p.WhichOneof("kind") == "source"]
    assert of_kind(events, "source") == sources
    first, second = sources
    assert (first.text_id, first.cited_text, first.source_type) == (
        "b1",
        "330 metres",
        message_pb2.SOURCE_TYPE_DOCUMENT,
    )
    assert (first.text_span.start_index, first.text_span.end_index) == (13, 23)
    location = first.location
    assert (location.unit, location.document_index, location.start, location.end) == (
        message_pb2.SOURCE_LOCATION_UNIT_CHARACTER,
        0,
        4,
        14,
    )
    # Provider metadata is bounded: a long string is cut.
    assert len(first.provider_metadata.fields["anthropic"].struct_value.fields["long"].string_value) == 4096
    assert second.text_id == ""  # it named a block the step does not have

    big, small = [p.file for p in reply.parts if p.WhichOneof("kind") == "file"]
    assert of_kind(events, "file") == [big, small]
    assert big.WhichOneof("content") == "provider_file_id" and big.provider_file_id == "file-big"
    assert big.size_bytes == len(BIG) and not big.data
    assert big.provider_metadata.fields["openai"].struct_value.fields["item_id"].string_value == "ig_1"
    assert small.data == SMALL and small.size_bytes == len(SMALL)
    assert reply.ByteSize() < 4 << 20  # readable with gRPC's default limit

    (step,) = recorder.steps
    assert list(step.sources) == sources and list(step.files) == [big, small]
    assert any("kept by reference" in warning and f"{len(BIG):,}" in warning for warning in step.warnings)
