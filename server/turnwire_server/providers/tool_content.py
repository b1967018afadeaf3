"""Tool results that hold media: MCP content blocks sent as each API's own content.

An MCP tool's result with more than one text is stored as its content blocks
(:mod:`turnwire_server.tools.mcp_server`): ``[{"type": "text", "text"}, {"type": "image", "data",
"mimeType"}, {"type": "audio", …}, {"type": "resource", "resource": {"uri", "mimeType", "text" |
"blob"}}, {"type": "resource_link", "uri", "name"}]``
(https://modelcontextprotocol.io/specification/2025-06-18/server/tools#tool-result). Sent as JSON
text, the model would read kilobytes of base64 instead of seeing the picture. When a result is a
list of such blocks with at least one image, audio or embedded resource (any tool may return one),
:func:`tool_media` reads it and each request builder sends it natively (docs/providers.md, "What
each API's parts become"):

- text, and text resources (prefixed with their URI): Anthropic ``text`` blocks, Responses
  ``input_text``, Chat the ``tool`` message's text;
- images (PNG, JPEG, GIF, WebP): Anthropic ``image`` blocks, Responses ``input_image``; Chat: a
  placeholder in the ``tool`` message and the image, labelled, in a ``user`` message sent right
  after the step's ``tool`` messages;
- PDF resources: Anthropic ``document`` blocks, Responses ``input_file``; Chat as images, a
  ``file`` part;
- audio (WAV, MP3): a placeholder for Anthropic and Responses (neither takes audio in a tool
  result); Chat as images, an ``input_audio`` part;
- other media and resource links: a placeholder naming the media type (and URI) everywhere.

A placeholder is a short text (``[image/png image 1: attached below]``); base64 is never pasted
into text.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnwire.values import loads, tool_call_output_json
from turnwire_client.v1 import message_pb2

_BLOCK_TYPES = frozenset({"text", "image", "audio", "resource", "resource_link"})
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types all three APIs take."""
AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}
"""Audio media type → Chat ``input_audio`` format."""


@dataclass(frozen=True, slots=True)
class Media:
    """An image, audio or binary resource of a tool result: ``data`` is base64 text (as MCP
    gives it), ``uri`` the resource's, when it is one; ``number`` counts media in the result
    from 1 (what placeholders name)."""

    kind: str  # "image", "audio" or "file"
    media_type: str
    data: str
    number: int
    uri: str = ""

    @property
    def data_url(self) -> str:
        """The media as a ``data:`` URL."""
        return f"data:{self.media_type};base64,{self.data}"

    def placeholder(self, where: str) -> str:
        """A short text standing for this media: ``[image/png image 1: <where>]``."""
        named = f" {self.uri}" if self.uri else ""
        return f"[{self.media_type} {self.kind} {self.number}{named}: {where}]"


ToolContent = Sequence[str | Media]
"""A tool result's blocks in order: texts, and media."""


def tool_media(call: message_pb2.ToolCallPart) -> ToolContent | None:
    """The blocks of a successful call's result when it is a list of MCP content blocks holding
    an image, audio or embedded resource (see the module docstring); None for any other result,
    which goes back as text (:func:`~turnwire_server.providers.convert.tool_result`)."""
    if call.state != message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
        return None
    text = tool_call_output_json(call)
    if not text.startswith("[") or '"type"' not in text:  # cheap: most results are not lists
        return None
    blocks = loads(text)
    if not isinstance(blocks, list) or not blocks or not all(_is_block(b) for b in blocks):
        return None
    if not any(b["type"] in ("image", "audio", "resource") for b in blocks):
        return None
    content: list[str | Media] = []
    for block in blocks:
        item = _read(block, sum(isinstance(c, Media) for c in content) + 1)
        if item is not None:
            content.append(item)
    return content


def _is_block(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") not in _BLOCK_TYPES:
        return False
    kind = block["type"]
    if kind == "text":
        return isinstance(block.get("text"), str)
    if kind in ("image", "audio"):
        return isinstance(block.get("data"), str) and isinstance(block.get("mimeType"), str)
    if kind == "resource":
        resource = block.get("resource")
        return isinstance(resource, dict) and isinstance(resource.get("uri"), str)
    return isinstance(block.get("uri"), str)  # resource_link


def _read(block: dict[str, Any], number: int) -> str | Media | None:
    kind = block["type"]
    if kind == "text":
        return block["text"] if block["text"].strip() else None
    if kind in ("image", "audio"):
        return _media(kind, block["mimeType"], block["data"], number)
    if kind == "resource_link":
        name = block.get("name") or block["uri"]
        return f"[resource link {name}: {block['uri']}]"
    resource = block["resource"]
    uri, media_type = resource["uri"], resource.get("mimeType") or "application/octet-stream"
    if isinstance(resource.get("text"), str):
        return f"[resource {uri}]\n{resource['text']}"
    if isinstance(resource.get("blob"), str):
        kind = (
            "image"
            if media_type.startswith("image/")
            else "audio"
            if media_type.startswith("audio/")
            else "file"
        )
        return _media(kind, media_type, resource["blob"], number, uri)
    return f"[resource {uri}]"


def _media(kind: str, media_type: str, data: str, number: int, uri: str = "") -> Media | str:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{media_type} {kind} {number}: not valid base64, not sent]"
    return Media(kind, media_type, data, number, uri)


def sendable(media: Media, *, audio: bool = False) -> bool:
    """True when an API's content can carry ``media``: images of :data:`IMAGE_TYPES`, PDFs, and
    (``audio``, Chat's user messages) WAV and MP3."""
    return (
        media.media_type in IMAGE_TYPES
        or media.media_type == "application/pdf"
        or (audio and media.media_type in AUDIO_FORMATS)
    )


def anthropic_content(content: ToolContent) -> list[dict[str, Any]]:
    """A Messages ``tool_result``'s ``content`` blocks for ``content`` (``text``, ``image``,
    ``document``; https://platform.claude.com/docs/en/agents-and-tools/tool-use/implement-tool-use)."""
    blocks: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str):
            blocks.append({"type": "text", "text": item})
        elif sendable(item):
            kind = "image" if item.media_type in IMAGE_TYPES else "document"
            source = {"type": "base64", "media_type": item.media_type, "data": item.data}
            blocks.append({"type": kind, "source": source})
        else:
            blocks.append({"type": "text", "text": item.placeholder("not sent, the API does not take it")})
    return blocks


def responses_output(content: ToolContent) -> list[dict[str, Any]]:
    """A Responses ``function_call_output``'s ``output`` list for ``content`` (``input_text``,
    ``input_image``, ``input_file``; https://platform.openai.com/docs/api-reference/responses/create)."""
    items: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str):
            items.append({"type": "input_text", "text": item})
        elif item.media_type in IMAGE_TYPES:
            items.append({"type": "input_image", "image_url": item.data_url, "detail": "auto"})
        elif item.media_type == "application/pdf":
            items.append({"type": "input_file", "file_data": item.data_url, "filename": _filename(item)})
        else:
            text = item.placeholder("not sent, the API does not take it")
            items.append({"type": "input_text", "text": text})
    return items


def chat_content(content: ToolContent, tool_name: str) -> tuple[str, list[dict[str, Any]]]:
    """``(tool message text, user message parts)`` for ``content``: Chat ``tool`` messages take
    text only, so each image, PDF or audio stands as a placeholder there and goes, labelled, in
    the parts of a ``user`` message sent after the step's ``tool`` messages (``image_url``,
    ``file``, ``input_audio``; https://platform.openai.com/docs/guides/function-calling)."""
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str):
            texts.append(item)
        elif sendable(item, audio=True):
            texts.append(item.placeholder("attached in the next user message"))
            label = f"[{item.media_type} {item.kind} {item.number} of the {tool_name} result]"
            parts.append({"type": "text", "text": label})
            if item.media_type in IMAGE_TYPES:
                parts.append({"type": "image_url", "image_url": {"url": item.data_url}})
            elif item.media_type == "application/pdf":
                parts.append(
                    {"type": "file", "file": {"file_data": item.data_url, "filename": _filename(item)}}
                )
            else:
                audio = {"data": item.data, "format": AUDIO_FORMATS[item.media_type]}
                parts.append({"type": "input_audio", "input_audio": audio})
        else:
            texts.append(item.placeholder("not sent, the API does not take it"))
    return "\n".join(texts), parts


def _filename(media: Media) -> str:
    name = media.uri.rstrip("/").rsplit("/", 1)[-1] if media.uri else ""
    return name or f"document-{media.number}.pdf"
