"""Anthropic citations → :class:`turnwire.types.Source`; files code execution made →
:class:`turnwire.types.File`.

A text block of a Messages reply carries the citations that support it (``citations_delta`` while
it streams, ``citations`` on a whole block). Each one becomes its own Source, tied to that block
(``text_id``), with the passage it quotes (``cited_text``) and where the passage is
(https://platform.claude.com/docs/en/build-with-claude/citations,
https://platform.claude.com/docs/en/agents-and-tools/tool-use/web-search-tool):

- ``web_search_result_location``: a URL source (``url``, ``title``; ``encrypted_index`` in its
  metadata);
- ``char_location``: a ``text/plain`` document ``document_index``, characters
  ``[start_char_index, end_char_index)``;
- ``page_location``: an ``application/pdf`` document, pages ``[start_page_number,
  end_page_number)`` (1-based);
- ``content_block_location``: a document, content blocks ``[start_block_index, end_block_index)``;
- ``search_result_location``: document ``search_result_index`` (its ``url`` when its ``source``
  is one), content blocks as above.

``document_title`` is the title; a ``file_id`` (a Files API document) is ``provider_file_id``.
The citation's other fields (``type``, ``encrypted_index`` …) are kept in
``provider_metadata["anthropic"]``.

Files: a code execution result (``code_execution_tool_result``, ``bash_code_execution_tool_result``)
lists the files its code wrote as outputs with a ``file_id`` (the Files API keeps them,
https://platform.claude.com/docs/en/agents-and-tools/tool-use/code-execution-tool); each becomes a
File by reference (``provider_file_id``; the bytes are fetched with the Files API, not by Turnwire).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnwire.types import File, Source, SourceLocation, SourceLocationUnit

_LOCATIONS: dict[str, tuple[SourceLocationUnit, str, str, str]] = {
    "char_location": ("character", "start_char_index", "end_char_index", "text/plain"),
    "page_location": ("page", "start_page_number", "end_page_number", "application/pdf"),
    "content_block_location": ("content_block", "start_block_index", "end_block_index", ""),
    "search_result_location": ("content_block", "start_block_index", "end_block_index", ""),
}
"""Document citation type → (unit, start field, end field, media type of such a document)."""

_MAPPED = frozenset(
    {
        *("cited_text", "url", "title", "document_title", "document_index", "file_id", "source"),
        *("search_result_index", "start_char_index", "end_char_index", "start_page_number"),
        *("end_page_number", "start_block_index", "end_block_index"),
    }
)
"""Citation fields that have a place of their own in a Source (the rest go to its metadata)."""


def citation_source(citation: Mapping[str, Any], source_id: str, text_id: str) -> Source:
    """The Source of one Anthropic ``citation`` of text block ``text_id`` (see the module
    docstring). Unknown citation types become a document Source with what they carry."""
    kind = str(citation.get("type") or "")
    metadata = {"anthropic": {k: v for k, v in citation.items() if k not in _MAPPED}}
    cited_text = _text(citation.get("cited_text"))
    title = _text(citation.get("title")) or _text(citation.get("document_title"))
    if kind == "web_search_result_location" or (kind not in _LOCATIONS and citation.get("url")):
        return Source(
            source_id=source_id,
            url=_text(citation.get("url")),
            title=title,
            source_type="url",
            cited_text=cited_text,
            text_id=text_id,
            provider_metadata=metadata,
        )
    unit, start, end, media_type = _LOCATIONS.get(kind, (None, "", "", ""))
    index = citation.get("search_result_index", citation.get("document_index"))
    location = SourceLocation(
        document_index=_int(index),
        unit=unit,
        start=_int(citation.get(start)) if start else 0,
        end=_int(citation.get(end)) if end else 0,
    )
    origin = _text(citation.get("source"))  # a search result's source: a URL or a name
    return Source(
        source_id=source_id,
        url=origin if origin.startswith(("http://", "https://")) else "",
        title=title or origin,
        media_type=media_type,
        source_type="document",
        cited_text=cited_text,
        location=location,
        text_id=text_id,
        provider_file_id=_text(citation.get("file_id")),
        provider_metadata=metadata,
    )


def result_files(block: Mapping[str, Any]) -> list[File]:
    """The files a server tool result ``block`` names (see the module docstring), in order."""
    result = block.get("content")
    outputs = result.get("content") if isinstance(result, Mapping) else None
    files = []
    for output in outputs if isinstance(outputs, list) else ():
        file_id = _text(output.get("file_id")) if isinstance(output, Mapping) else ""
        if file_id:
            metadata = {"anthropic": {"tool_use_id": block.get("tool_use_id"), "type": output.get("type")}}
            files.append(
                File(
                    media_type="application/octet-stream",
                    provider_file_id=file_id,
                    provider_metadata=metadata,
                )
            )
    return files


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
