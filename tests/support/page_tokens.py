"""Crafted ListConversations page tokens, for the store and end-to-end tests.

The three of issue 9 item 7 are version 1 (base64url JSON) tokens that made the old JSON
parser fail with something other than InvalidPageToken. The ``v3_*`` ones are the same
attacks on today's binary layout (see ``turnwire_server.store.core.page_tokens``): version
byte 3, the 8-byte BLAKE2b digest of the listing's scope (the tenant's key prefix, "" without
authentication), the update time as a signed 64-bit big-endian integer, the id in UTF-8.
"""

from __future__ import annotations

import base64
import hashlib
import struct

from hypothesis import strategies as st

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def b64(payload: bytes) -> str:
    """``payload`` as base64url without padding, as tokens are written."""
    return base64.urlsafe_b64encode(payload).decode("ascii").rstrip("=")


def scope_digest(id_prefix: str = "") -> bytes:
    """The digest a token of the listing of ``id_prefix`` carries."""
    return hashlib.blake2b(id_prefix.encode(), digest_size=8).digest()


def v3(update_us: int, conversation_id: bytes, id_prefix: str = "") -> str:
    """A version 3 token from its parts (``conversation_id`` as raw bytes, so it may be invalid
    UTF-8; without ``id_prefix``, which the digest binds instead)."""
    return b64(struct.pack(">B8sq", 3, scope_digest(id_prefix), update_us) + conversation_id)


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
    "v1_well_formed": b64(b'{"v":1,"u":1,"id":"c"}'),  # the old formats are refused, not misread
    "v2_well_formed": b64(struct.pack(">Bq", 2, 1) + b"c"),
    "v3_other_scope": v3(1, b"c", "tenant-b/"),  # another tenant's listing
    "v3_surrogate_id": v3(1, "\ud800".encode("utf-8", "surrogatepass")),
    "v3_invalid_utf8_id": v3(1, b"\xff\xfe"),
    "v3_empty_id": v3(1, b""),
    "v3_largest_int64": v3(2**63 - 1, b"c"),
    "v3_smallest_int64": v3(-(2**63), b"c"),
    "v3_version_4": b64(struct.pack(">B8sq", 4, scope_digest(), 1) + b"c"),
    "v3_truncated_time": b64(b"\x03" + scope_digest() + b"\x00\x00\x00"),
    "v3_trailing_newline": v3(1, b"c") + "\n",
    "v3_padded": v3(1, b"c") + "=",
    "v3_standard_base64": base64.b64encode(struct.pack(">B8sq", 3, scope_digest(), 1) + b"c??>")
    .decode()
    .rstrip("="),
    "v3_other_spelling": other_spelling(v3(1, b"cc")),
    "v3_too_long": v3(1, b"c" * 4000),
    "length_1_mod_4": "AAAAA",
    "empty_looking": "-",
    "not_base64": "garbage!",
}
"""Every one must be refused as InvalidPageToken (INVALID_PAGE_TOKEN through the API)."""

TOKENS_OF_ANY_KIND = st.one_of(
    st.text(),  # any characters, lone surrogates included (the store is called directly)
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
    st.binary().map(b64),
    st.binary().map(lambda payload: b64(b"\x03" + scope_digest() + payload)),  # past the version check
    st.builds(v3, INT64, st.binary(min_size=1)),
    st.builds(v3, INT64, st.text(min_size=1).map(lambda t: t.encode("utf-8", "surrogatepass"))),
    st.sampled_from(sorted(CRAFTED_TOKENS.values())),
)
"""Strings a client could send as a page token: arbitrary, or shaped to get deep into decoding."""

SENDABLE_TOKENS = TOKENS_OF_ANY_KIND.filter(lambda token: not any("\ud800" <= c <= "\udfff" for c in token))
"""As :data:`TOKENS_OF_ANY_KIND`, less strings protobuf cannot carry (a proto string is UTF-8)."""
