"""Sources and files in each API's real wire format (``cases_extra/sse/parts_*``, issue 31), replayed
through the official SDKs into the adapters: every citation becomes a Source with its cited text, its
location in the document and the text block it supports; every generated file a File. Then what the
engine stores from the stream keeps the same, with the cited text's part marked by its block id, and
the next request to the same API is valid and carries no base64 as text.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

from providers.helpers import (
    Stored,
    a_text_stream,
    anthropic_http,
    c_text_stream,
    collect,
    openai_http,
    r_text_stream,
    request,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.providers import Provider
from turnwire.values import from_struct
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

EXTRA = Path(__file__).resolve().parent / "cases_extra" / "sse"
CASE_NAMES = sorted(path.name.removesuffix(".sse") for path in EXTRA.glob("parts_*.sse"))
_UNITS = {
    message_pb2.SOURCE_LOCATION_UNIT_CHARACTER: "character",
    message_pb2.SOURCE_LOCATION_UNIT_PAGE: "page",
    message_pb2.SOURCE_LOCATION_UNIT_CONTENT_BLOCK: "content_block",
}


def _provider(adapter: str, replay: ReplayServer) -> tuple[Provider, bytes]:
    """The adapter on the official SDK pointed at ``replay``, and a plain reply for the next request."""
    if adapter == "anthropic":
        client = anthropic.AsyncAnthropic(
            api_key="test-key", base_url=replay.url, max_retries=0, http_client=anthropic_http()
        )
        return AnthropicMessagesProvider("anthropic", client, retry_delay=0.01), a_text_stream("ok")
    oai = openai.AsyncOpenAI(
        api_key="test-key", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    if adapter == "openai":
        return OpenAIChatProvider("vendor", oai, retry_delay=0.01), c_text_stream("ok")
    return OpenAIResponsesProvider("vendor", oai, retry_delay=0.01), r_text_stream("ok")


def test_the_parts_cases_are_there() -> None:
    kinds = {name.split("_")[1] for name in CASE_NAMES}
    assert kinds == {"anthropic", "chat", "responses"}, CASE_NAMES


@pytest.mark.parametrize("name", CASE_NAMES)
async def test_parts_case(name: str, replay: ReplayServer) -> None:
    case = orjson.loads((EXTRA / f"{name}.expected.json").read_bytes())
    expected = case["expected"]
    provider, next_reply = _provider(case["adapter"], replay)
    replay.enqueue(Reply.sse((EXTRA / f"{name}.sse").read_bytes()), Reply.sse(next_reply))
    question = user("Tell me about it.")
    try:
        result = await collect(provider, request(question))
        stored = Stored().step(result.chunks).build()
        await collect(provider, request(question, stored, user("Thanks.")))
    finally:
        await provider.aclose()

    assert result.error is None, result.error
    assert result.text == expected["text"]
    block_text: dict[str, str] = {}
    for chunk in result.of(base.TextDelta):
        block_text[chunk.id] = block_text.get(chunk.id, "") + chunk.delta
    sources = result.of(base.Source)
    assert [_chunk_source(s, block_text) for s in sources] == expected["sources"]
    assert len({s.source_id for s in sources}) == len(sources)  # each its own id
    assert [_chunk_file(f) for f in result.of(base.File)] == [_no_metadata(f) for f in expected["files"]]
    for chunk, want in zip(result.of(base.File), expected["files"], strict=True):
        assert chunk.provider_metadata == want.get("metadata", chunk.provider_metadata)

    # What the engine stores: the same sources, each tied to its text part by the block id.
    parts = stored.parts
    texts = {p.text.id: p.text.text for p in parts if p.WhichOneof("kind") == "text" and p.text.id}
    kept = [p.source for p in parts if p.WhichOneof("kind") == "source"]
    assert [_stored_source(s, texts) for s in kept] == expected["sources"]
    files = [p.file for p in parts if p.WhichOneof("kind") == "file"]
    assert [_stored_file(f) for f in files] == [_no_metadata(f) for f in expected["files"]]

    # The next request to the same API: valid, and no file's bytes pasted as text.
    sent = replay.requests[1].body
    for chunk in result.of(base.File):
        if chunk.data:
            assert __import__("base64").b64encode(chunk.data)[:40] not in sent


def _chunk_source(source: base.Source, block_text: dict[str, str]) -> dict[str, Any]:
    location = source.location
    return {
        "source_type": source.source_type,
        "url": source.url,
        "title": source.title,
        "media_type": source.media_type,
        "filename": source.filename,
        "cited_text": source.cited_text,
        "location": None
        if location is None
        else {
            "unit": location.unit,
            "document_index": location.document_index,
            "start": location.start,
            "end": location.end,
        },
        "text": block_text.get(source.text_id, f"<no block {source.text_id!r}>"),
        "text_span": list(source.text_span) if source.text_span is not None else None,
        "provider_file_id": source.provider_file_id,
        "metadata": dict(source.provider_metadata or {}),
    }


def _stored_source(source: message_pb2.SourcePart, texts: dict[str, str]) -> dict[str, Any]:
    location = source.location if source.HasField("location") else None
    return {
        "source_type": "url" if source.source_type == message_pb2.SOURCE_TYPE_URL else "document",
        "url": source.url,
        "title": source.title,
        "media_type": source.media_type,
        "filename": source.filename,
        "cited_text": source.cited_text,
        "location": None
        if location is None
        else {
            "unit": _UNITS.get(location.unit),
            "document_index": location.document_index,
            "start": location.start,
            "end": location.end,
        },
        "text": texts.get(source.text_id, f"<no text part {source.text_id!r}>"),
        "text_span": [source.text_span.start_index, source.text_span.end_index]
        if source.HasField("text_span")
        else None,
        "provider_file_id": source.provider_file_id,
        "metadata": from_struct(source.provider_metadata),
    }


def _chunk_file(file: base.File) -> dict[str, Any]:
    return {
        "media_type": file.media_type,
        "size_bytes": len(file.data),
        "sha256": hashlib.sha256(file.data).hexdigest() if file.data else "",
        "url": file.url,
        "provider_file_id": file.provider_file_id,
    }


def _stored_file(file: message_pb2.FilePart) -> dict[str, Any]:
    return {
        "media_type": file.media_type,
        "size_bytes": file.size_bytes,
        "sha256": hashlib.sha256(file.data).hexdigest() if file.data else "",
        "url": file.url,
        "provider_file_id": file.provider_file_id,
    }


def _no_metadata(file: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in file.items() if k != "metadata"}
