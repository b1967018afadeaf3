"""Credentials for the authentication tests: static token files, key sets and signed JWTs.

Every key is made here with ``cryptography`` (nothing is downloaded or checked in). A
:class:`Issuer` holds one EC P-256 key with a key id; :func:`write_jwks` publishes the public
halves of some issuers as a JWKS file (RFC 7517 §5), as an identity provider would.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

ISSUER = "https://issuer.turnwire.test"
AUDIENCE = "turnwire-test"


class Issuer:
    """One signing key (ES256) with key id ``kid``."""

    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.key = ec.generate_private_key(ec.SECP256R1())

    def public_jwk(self) -> dict[str, Any]:
        """The public key as a JWK with ``kid``, ``alg`` and ``use``."""
        jwk: dict[str, Any] = json.loads(ECAlgorithm.to_jwk(self.key.public_key()))
        jwk.update(kid=self.kid, alg="ES256", use="sig")
        return jwk

    def sign(self, *, kid: str | None = None, **claims: Any) -> str:
        """A JWT over the standard valid claims (``iss``, ``aud``, ``sub``, ``tenant``, ``iat``,
        ``exp`` in 5 minutes), overridden by ``claims``; a claim given as None is left out."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "jwt-user",
            "tenant": "tenant-j",
            "iat": now,
            "exp": now + 300,
        }
        body.update(claims)
        body = {name: value for name, value in body.items() if value is not None}
        return jwt.encode(body, self.key, algorithm="ES256", headers={"kid": kid or self.kid})


def write_jwks(path: Path, *issuers: Issuer) -> Path:
    """Write the public keys of ``issuers`` as a JWKS file; returns ``path``."""
    path.write_text(json.dumps({"keys": [issuer.public_jwk() for issuer in issuers]}), encoding="utf-8")
    return path


def new_token() -> str:
    """A fresh random static token (43 URL-safe characters)."""
    return secrets.token_urlsafe(32)


def write_tokens_file(path: Path, entries: dict[str, tuple[str, str]]) -> Path:
    """Write a static tokens file listing each token of ``entries`` (token → (principal,
    tenant)) by its SHA-256, as docs/operate/authentication.md recommends; returns ``path``."""
    document = {
        "tokens": [
            {"sha256": hashlib.sha256(token.encode()).hexdigest(), "principal": principal, "tenant": tenant}
            for token, (principal, tenant) in entries.items()
        ]
    }
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def auth_config(
    tokens_file: Path | None = None, jwks_file: Path | None = None, **auth: Any
) -> dict[str, Any]:
    """The ``auth:`` section: on, with the given sources (the JWT ones checked against
    :data:`ISSUER` and :data:`AUDIENCE`)."""
    section: dict[str, Any] = {"enabled": True, **auth}
    if tokens_file is not None:
        section["tokens_file"] = str(tokens_file)
    if jwks_file is not None:
        section["jwt"] = {"jwks_file": str(jwks_file), "issuer": ISSUER, "audience": AUDIENCE}
    return section
