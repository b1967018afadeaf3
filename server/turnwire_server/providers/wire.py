"""Reading provider bodies: JSON that orjson refuses, and characters split across stream deltas.

Servers stream text as JSON strings cut at token boundaries, and a token
boundary can fall inside a character (docs/semantics.md §11, provider-valid
history):

- an emoji outside the Basic Multilingual Plane written as a JSON escape pair,
  ``"Smile \\ud83d"`` then ``"\\ude00 done"``: each event holds a lone UTF-16
  surrogate, which orjson rejects ("no low surrogate in string");
- a multi-byte UTF-8 character whose bytes are split over two events (small
  local servers that stream raw bytes): each event is invalid UTF-8.

:func:`load_json` parses such an event anyway (the standard library keeps lone
surrogates; invalid bytes become ``surrogateescape`` code points), and a
:class:`TextJoiner` per decoder holds the unfinished end of a delta until the
next delta of the same block completes it. What never gets completed becomes
U+FFFD when its block ends: a stream is never failed for it, and no string with
a lone surrogate ever leaves an adapter (protobuf could not encode it).

Only the slow path pays: orjson parses every well-formed event, and a delta
without surrogates passes :meth:`TextJoiner.push` after one ``isascii`` or one
regex scan.

A body that is not JSON at all (a proxy's HTML error page, a plain-text line)
is quoted in error messages through :func:`excerpt`: one line, readable, short.
"""

from __future__ import annotations

import html.parser
import json
import re
from typing import Any

import orjson

from turnwire.providers import ProviderError

REPLACEMENT = "\ufffd"

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_BYTES = re.compile("[\udc80-\udcff]+")


EXCERPT_CHARS = 200
_HTML_START = re.compile(r"\s*<(?:!doctype|!--|[a-z][a-z0-9]*[\s/>])", re.IGNORECASE)
_SPACE = re.compile(r"\s+")


class _HtmlText(html.parser.HTMLParser):
    """The text of an HTML page: the contents of ``script``/``style`` dropped, character references
    decoded, a piece equal to the one before it (a ``<title>`` repeated as ``<h1>``) dropped."""

    _HIDDEN = frozenset({"script", "style"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._HIDDEN:
            self._hidden += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN and self._hidden:
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        piece = _SPACE.sub(" ", data).strip()
        if piece and not self._hidden and (not self.pieces or self.pieces[-1] != piece):
            self.pieces.append(piece)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` (an error body that is not JSON) as one readable line of at most ``limit`` characters:
    the text of an HTML page (a proxy's "502 Bad Gateway"), whitespace collapsed, cut with "…".
    The whole body stays in ``ProviderError.body``."""
    if _HTML_START.match(text):
        parser = _HtmlText()
        parser.feed(text)
        parser.close()
        text = " ".join(parser.pieces)
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def load_json(provider: str, data: bytes, what: str = "the stream sent a line") -> Any:
    """``data`` parsed as JSON; lone surrogates and invalid UTF-8 are kept for :class:`TextJoiner`
    (see the module docstring). Raises ProviderError (type ``invalid_stream_data``, not retryable,
    ``in_stream``: it is read from a 2xx response) when it is not JSON at all."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data.decode("utf-8", "surrogateescape"))
    except ValueError:
        text = data.decode("utf-8", "replace")
        raise ProviderError(
            f"{provider}: {what} that is not JSON: {excerpt(text)}",
            type="invalid_stream_data",
            body=text,
            provider=provider,
            in_stream=True,
        ) from None


def clean_text(text: str) -> str:
    """``text`` with surrogate pairs joined, escaped UTF-8 bytes decoded, and whatever is left of
    either replaced by U+FFFD."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    # Pairs first (a high surrogate followed by a low one is one character), keeping lone ones.
    text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    text = _ESCAPED_BYTES.sub(_decode_bytes, text)
    return _SURROGATE.sub(REPLACEMENT, text)


def clean_strings(value: Any) -> Any:
    """``value`` (parsed JSON) with :func:`clean_text` applied to every string in it."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_strings(k): clean_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_strings(v) for v in value]
    return value


def _decode_bytes(match: re.Match[str]) -> str:
    return bytes(ord(c) - 0xDC00 for c in match.group()).decode("utf-8", "replace")


def _unfinished_tail(text: str) -> int:
    """How many characters at the end of ``text`` start a character that the next delta may finish:
    a UTF-16 high surrogate, or the first bytes of a UTF-8 sequence (as escaped code points)."""
    last = ord(text[-1])
    if 0xD800 <= last <= 0xDBFF:
        return 1
    if not 0xDC80 <= last <= 0xDCFF:
        return 0
    # Escaped bytes: find the lead byte of the last sequence (at most 3 back) and its length.
    for back in range(1, min(4, len(text)) + 1):
        code = ord(text[-back])
        if not 0xDC80 <= code <= 0xDCFF:
            return 0
        byte = code - 0xDC00
        if byte >= 0xC0:
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < needed else 0
    return 0


class TextJoiner:
    """Joins characters split across the deltas of one block (keyed by any string: a block id, a
    tool call id). :meth:`push` returns what can be emitted now; :meth:`flush`, when the block ends,
    what is left (U+FFFD for an unfinished character, else "")."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, str] = {}

    def push(self, key: str, text: str) -> str:
        """The part of ``text`` (after what was held for ``key``) that is complete."""
        if self._held:
            held = self._held.pop(key, "")
            if held:
                text = held + text
        if not text or text.isascii() or _SURROGATE.search(text) is None:
            return text
        tail = _unfinished_tail(text)
        if tail:
            self._held[key] = text[-tail:]
            text = text[:-tail]
        return clean_text(text)

    def flush(self, key: str) -> str:
        """What is still held for ``key`` (the block ended): U+FFFD for it, or ""."""
        if not self._held:
            return ""
        held = self._held.pop(key, "")
        return clean_text(held) if held else ""
