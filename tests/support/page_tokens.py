"""Crafted ListConversations page tokens, for the store and end-to-end tests.

The three of issue 9 item 7 are version 1 (base64url JSON) tokens that made the old JSON
parser fail with something other than InvalidPageToken. The ``V2_*`` ones are the same
attacks on today's binary layout (see ``turnwire_server.store.core.rows``): version
byte 2, the update time as a signed 64-bit big-endian integer, the id in UTF-8.
"""

from __future__ import annotations

import base64
import struct

from hypothesis import strategies as st

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def b64(payload: bytes) -> str:
    """``payload`` as base64url without padding, as tokens are written."""
    return base64.urlsafe_b64encode(payload).decode("ascii").rstrip("=")


def v2(update_us: int, conversation_id: bytes) -> str:
    """A version 2 token from its parts (``conversation_id`` as raw bytes, so it may be invalid UTF-8)."""
    return b64(struct.pack(">Bq", 2, update_us) + conversation_id)


def other_spelling(token: str) -> str:
    """``token`` with its last character's unused low bits set: the same bytes, spelt otherwise."""
    assert len(token) % 4 in (2, 3), "the last character must carry unused bits"
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return token[:-1] + alphabet[alphabet.index(token[-1]) | 1]


ISSUE_9_TOKENS: dict[str, str] = {
    # OverflowError when SQLite bound the integer.
    "huge_integer": b64(b'{"v":1,"u":' + b"9" * 40 + b',"id":"c"}'),
    # RecursionError in json.loads (and still under the length cap, so the parser is what is tested).
    "nested_brackets": b64(b"[" * 3000),
    # UnicodeEncodeError when SQLite bound the id, reported as STORE_UNAVAILABLE.
    "lone_surrogate": b64(b'{"v":1,"u":1,"id":"\\ud800"}'),
}

CRAFTED_TOKENS: dict[str, str] = {
    **ISSUE_9_TOKENS,
    "v1_well_formed": b64(b'{"v":1,"u":1,"id":"c"}'),  # the old format is refused, not misread
    "v2_surrogate_id": v2(1, "\ud800".encode("utf-8", "surrogatepass")),
    "v2_invalid_utf8_id": v2(1, b"\xff\xfe"),
    "v2_empty_id": v2(1, b""),
    "v2_largest_int64": v2(2**63 - 1, b"c"),
    "v2_smallest_int64": v2(-(2**63), b"c"),
    "v2_version_3": b64(struct.pack(">Bq", 3, 1) + b"c"),
    "v2_truncated_time": b64(b"\x02\x00\x00\x00"),
    "v2_trailing_newline": v2(1, b"c") + "\n",
    "v2_padded": v2(1, b"c") + "=",
    "v2_standard_base64": base64.b64encode(struct.pack(">Bq", 2, 1) + b"??>").decode().rstrip("="),
    "v2_other_spelling": other_spelling(v2(1, b"c")),
    "v2_too_long": v2(1, b"c" * 4000),
    "length_1_mod_4": "AAAAA",
    "empty_looking": "-",
    "not_base64": "garbage!",
}
"""Every one must be refused as InvalidPageToken (INVALID_PAGE_TOKEN through the API)."""

TOKENS_OF_ANY_KIND = st.one_of(
    st.text(),  # any characters, lone surrogates included (the store is called directly)
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
    st.binary().map(b64),
    st.binary().map(lambda payload: b64(b"\x02" + payload)),  # past the version check
    st.builds(v2, INT64, st.binary(min_size=1)),
    st.builds(v2, INT64, st.text(min_size=1).map(lambda t: t.encode("utf-8", "surrogatepass"))),
    st.sampled_from(sorted(CRAFTED_TOKENS.values())),
)
"""Strings a client could send as a page token: arbitrary, or shaped to get deep into decoding."""

SENDABLE_TOKENS = TOKENS_OF_ANY_KIND.filter(lambda token: not any("\ud800" <= c <= "\udfff" for c in token))
"""As :data:`TOKENS_OF_ANY_KIND`, less strings protobuf cannot carry (a proto string is UTF-8)."""
