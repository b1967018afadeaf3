"""Sources and files a scripted model step streams (``ScriptStep.sources`` / ``.files`` in
:mod:`turnwire.testing`), so tests and the conformance suite see citations and generated files
offline. A step's sources follow its text and cite it (``text_id``, the step's text block); its
files come after them (docs/providers.md, "What each API's parts become")."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from turnwire.types import File, ModelChunk, Source, SourceLocation, SourceLocationUnit, SourceType


class ScriptedLocation(BaseModel):
    """Where a scripted source's passage is: ``[start, end)`` in ``unit`` of document
    ``document_index``."""

    model_config = ConfigDict(extra="forbid")

    unit: SourceLocationUnit | None = None
    document_index: int = Field(0, ge=0)
    start: int = Field(0, ge=0)
    end: int = Field(0, ge=0)


class ScriptedSource(BaseModel):
    """A source a scripted step cites (fields as :class:`turnwire.types.Source`); ``text_span``
    ``[start, end)`` of the step's text."""

    model_config = ConfigDict(extra="forbid")

    url: str = ""
    title: str = ""
    source_type: SourceType = "url"
    media_type: str = ""
    filename: str = ""
    cited_text: str = ""
    location: ScriptedLocation | None = None
    text_span: tuple[int, int] | None = None
    provider_file_id: str = ""


class ScriptedFile(BaseModel):
    """A file a scripted step produces: ``data_base64`` (its bytes), ``url`` or
    ``provider_file_id``."""

    model_config = ConfigDict(extra="forbid")

    media_type: str
    filename: str = ""
    data_base64: str = ""
    url: str = ""
    provider_file_id: str = ""


def scripted_parts(
    sources: Sequence[ScriptedSource], files: Sequence[ScriptedFile], prefix: str, text_id: str
) -> list[ModelChunk]:
    """The chunks of a step's ``sources`` (ids ``<prefix>-src<n>``, citing ``text_id`` when the step
    has text) and ``files``, in order."""
    chunks: list[ModelChunk] = []
    for number, source in enumerate(sources, start=1):
        where = source.location
        chunks.append(
            Source(
                f"{prefix}-src{number}",
                url=source.url,
                title=source.title,
                media_type=source.media_type,
                filename=source.filename,
                source_type=source.source_type,
                cited_text=source.cited_text,
                location=None
                if where is None
                else SourceLocation(where.document_index, where.unit, where.start, where.end),
                text_id=text_id,
                text_span=source.text_span,
                provider_file_id=source.provider_file_id,
            )
        )
    for file in files:
        data = base64.b64decode(file.data_base64) if file.data_base64 else b""
        chunks.append(
            File(file.media_type, data, file.url, file.filename, provider_file_id=file.provider_file_id)
        )
    return chunks
