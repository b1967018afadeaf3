"""OpenAI-style citations and generated files → :class:`turnwire.types.Source` and
:class:`turnwire.types.File`, for the Responses and Chat Completions adapters.

Sources (each tied to the text block that carries it, ``text_id``):

- Responses ``output_text`` annotations
  (https://platform.openai.com/docs/api-reference/responses/object): ``url_citation`` (``url``,
  ``title``, ``start_index``, ``end_index``) → a URL source with its ``text_span``;
  ``file_citation`` (``file_id``, ``filename``, ``index``), ``container_file_citation``
  (``container_id`` kept in metadata, ``file_id``, ``filename``, ``start_index``, ``end_index``)
  and ``file_path`` (``file_id``, ``index``) → a document source with its ``provider_file_id``.
- Chat ``annotations`` (OpenAI search models; OpenRouter,
  https://openrouter.ai/docs/features/web-search): ``{"type": "url_citation", "url_citation":
  {url, title, content, start_index, end_index}}`` → a URL source, ``content`` as its cited text.
- Perplexity chunks (https://docs.perplexity.ai/api-reference/chat-completions-post): the
  top-level ``search_results`` (``title``, ``url``, ``date``, ``snippet``), else ``citations``
  (URLs alone) → URL sources in order, the n-th being the answer's marker ``[n]`` (kept in
  metadata ``perplexity.marker``).

Files: a ``data:`` URL (OpenRouter's ``delta.images``) or base64 bytes (a Responses
``image_generation_call`` ``result``) become bytes with their media type; a plain URL stays a URL.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from turnwire.types import File, Source

_SPANNED = frozenset({"url", "title", "start_index", "end_index", "file_id", "filename", "content"})
"""Annotation fields with a place of their own in a Source (the rest go to its metadata)."""


def annotation_source(annotation: Mapping[str, Any], source_id: str, text_id: str) -> Source | None:
    """The Source of one Responses or Chat annotation (see the module docstring), or None for an
    annotation that cites nothing (an unknown type without a URL or a file)."""
    kind = str(annotation.get("type") or "")
    nested = annotation.get(kind)  # Chat: {"type": "url_citation", "url_citation": {...}}
    fields: Mapping[str, Any] = nested if isinstance(nested, Mapping) else annotation
    url, file_id = _text(fields.get("url")), _text(fields.get("file_id"))
    if not url and not file_id:
        return None
    metadata = {k: v for k, v in fields.items() if k not in _SPANNED}
    metadata["type"] = kind
    start = fields.get("start_index", fields.get("index"))
    end = fields.get("end_index", fields.get("index"))
    span = (start, end) if _is_int(start) and _is_int(end) else None
    return Source(
        source_id=source_id,
        url=url,
        title=_text(fields.get("title")),
        filename=_text(fields.get("filename")),
        source_type="url" if url else "document",
        cited_text=_text(fields.get("content")),
        text_id=text_id,
        text_span=span,
        provider_file_id=file_id,
        provider_metadata={"openai": metadata},
    )


def perplexity_sources(chunk: Mapping[str, Any], prefix: str, text_id: str) -> list[Source]:
    """The Sources of a Perplexity chunk's ``search_results`` (title, date, snippet), else of its
    ``citations`` (URLs alone), in order: the n-th is the answer's marker ``[n]``."""
    results = chunk.get("search_results")
    if not isinstance(results, list) or not results:
        citations = chunk.get("citations")
        results = [{"url": url} for url in citations] if isinstance(citations, list) else []
    sources = []
    for number, result in enumerate(results, start=1):
        if not isinstance(result, Mapping) or not _text(result.get("url")):
            continue
        extra = {k: v for k, v in result.items() if k not in ("url", "title", "snippet")}
        sources.append(
            Source(
                source_id=f"{prefix}-src{number}",
                url=_text(result.get("url")),
                title=_text(result.get("title")),
                cited_text=_text(result.get("snippet")),
                text_id=text_id,
                provider_metadata={"perplexity": {"marker": f"[{number}]", **extra}},
            )
        )
    return sources


def image_file(encoded: str, media_type: str = "", metadata: Mapping[str, Any] | None = None) -> File | None:
    """A File from a ``data:`` URL, base64 text (its media type from ``media_type``, else sniffed
    from its first bytes: PNG, JPEG, WebP, GIF) or a plain URL; None for text that is none of them."""
    if encoded.startswith(("http://", "https://")):
        return File(media_type=media_type or "image/*", url=encoded, provider_metadata=metadata)
    if encoded.startswith("data:"):
        header, _, encoded = encoded.partition(",")
        media_type = header[5:].split(";")[0] or media_type
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    if not data:
        return None
    return File(media_type=media_type or sniff_image_type(data), data=data, provider_metadata=metadata)


def sniff_image_type(data: bytes) -> str:
    """The media type of image bytes by their signature; ``application/octet-stream`` if unknown."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    return "application/octet-stream"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
