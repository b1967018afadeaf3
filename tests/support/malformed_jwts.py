"""Malformed and hostile JWTs, for the authentication tests (issue 32 item 7).

A JWS in compact serialization is ``base64url(header) . base64url(payload) . base64url(sig)``
(RFC 7515 §7.1). :func:`signed` builds one from any header and payload, JSON or raw bytes, and
signs it with an :class:`~support.tokens.Issuer`'s key, so a hostile header or claim reaches
the checks that run after the signature verifies. :func:`hostile_jwts` draws them with
Hypothesis: numeric, list and missing ``kid``; ``crit`` of any shape; ``alg`` of any value;
headers and payloads that are not JSON, not objects, not UTF-8; claims of every JSON type,
huge integers (past Python's 4,300-digit limit too), ``Infinity`` and ``NaN``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from hypothesis import strategies as st

from support.tokens import AUDIENCE, ISSUER, Issuer


def b64(raw: bytes) -> str:
    """base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _encoded(part: dict[str, Any] | bytes) -> bytes:
    # json.dumps writes Infinity and NaN for the float values, as a hostile client might.
    return part if isinstance(part, bytes) else json.dumps(part).encode()


def signed(issuer: Issuer, header: dict[str, Any] | bytes, payload: dict[str, Any] | bytes) -> str:
    """A compact JWS of ``header`` and ``payload`` (dicts as JSON, bytes as they are) with a valid
    ES256 signature by ``issuer`` (RFC 7518 §3.4: r and s as 32-byte big-endian integers)."""
    signing_input = f"{b64(_encoded(header))}.{b64(_encoded(payload))}"
    der = issuer.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def valid_claims() -> dict[str, Any]:
    """Claims :class:`~support.tokens.Issuer` would sign (far-future ``exp``)."""
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "fuzz", "tenant": "fuzz", "exp": 2**40}


_HUGE_INTEGERS = st.sampled_from([10**20, -(10**20), 2**63, 2**64 + 1, -(2**63) - 1])
_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | _HUGE_INTEGERS
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    _JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
"""Any JSON value json.dumps writes, ``Infinity`` and ``NaN`` included."""

_RAW_PARTS = st.sampled_from(
    [
        b"",
        b"null",
        b"[]",
        b'"text"',
        b"42",
        b"{",
        b"\xff\xfe",
        b'{"alg":"ES256","kid":"key-1"',
        b"[" * 1500,  # past json's nesting limit: RecursionError
        b'{"exp":' + b"9" * 4400 + b"}",  # past int_max_str_digits: json.loads raises ValueError
        b'{"exp":1e999}',
        b'{"alg":"ES256","kid":"key-1","kid":7}',
    ]
)

_HEADER_MEMBERS = st.fixed_dictionaries(
    {},
    optional={
        "alg": st.sampled_from(["ES256", "RS256", "HS256", "none", "EdDSA", "", "ES512"]) | json_values,
        "kid": st.sampled_from(["key-1", "key-unknown"]) | json_values,
        "crit": st.sampled_from([["b64"], ["exp"], [], "b64", [7], None]) | json_values,
        "b64": st.booleans() | json_values,
        "typ": json_values,
        "jku": st.just("https://attacker.test/jwks.json"),
        "x5u": json_values,
        "jwk": json_values,
    },
)

_CLAIMS = st.fixed_dictionaries(
    {},
    optional={name: json_values for name in ("iss", "aud", "sub", "tenant", "exp", "nbf", "iat", "jti")},
).map(lambda drawn: {**valid_claims(), **drawn})


@st.composite
def hostile_jwts(draw: st.DrawFn, issuer: Issuer) -> str:
    """A token in JWS compact shape whose header, claims or bytes are hostile; most are signed by
    ``issuer`` (the key the server trusts) so that the checks after the signature run too."""
    header: dict[str, Any] | bytes = {"alg": "ES256", "kid": issuer.kid}
    payload: dict[str, Any] | bytes = valid_claims()
    hostile = draw(st.sampled_from(["header", "claims", "both"]))
    if hostile != "claims":
        header = draw(_HEADER_MEMBERS.map(lambda members: {"alg": "ES256", **members}) | _RAW_PARTS)
    if hostile != "header":
        payload = draw(_CLAIMS | _RAW_PARTS)
    token = signed(issuer, header, payload)
    if draw(st.integers(min_value=0, max_value=9)) == 0:  # a signature that does not verify
        head, body, _ = token.split(".")
        token = f"{head}.{body}.{b64(draw(st.binary(max_size=80)))}"
    return token
