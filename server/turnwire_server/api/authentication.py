"""Bearer tokens to callers: static tokens and JWTs (``auth:`` in the configuration).

A call carries ``authorization: Bearer <token>`` metadata (RFC 6750 §2.1, as gRPC sends it).
The token is, in this order:

* a **static token** from ``auth.tokens_file`` or the variable ``auth.tokens_env``: a YAML or
  JSON document ``{"tokens": [{"sha256": <hex>, "principal": …, "tenant": …}, …]}``. ``sha256``
  is the hex SHA-256 of the token, so the file holds no usable secret; ``token: <plain>`` is
  accepted too. The presented token's digest is compared with every entry in constant time
  (:func:`hmac.compare_digest`, no early exit).
* a **JWT** (RFC 7519) verified against the JSON Web Key Set in ``auth.jwt.jwks_file`` with
  PyJWT: the key by the header's ``kid`` (or the only key), the algorithm both in
  ``auth.jwt.algorithms`` (public-key algorithms only) and the one bound to that key (PyJWT's
  ``PyJWK``: no ``none``, no HS/RS confusion, RFC 8725 §2.1); ``exp``, ``iss``, ``aud`` and
  ``sub`` required, ``exp`` and ``nbf`` checked with ``leeway_seconds``. ``sub`` is the
  principal, the claim ``tenant_claim`` the tenant.

PyJWT over joserfc: it is already in the dependency tree (the MCP SDK needs it), is maintained,
binds each JWK to one algorithm, and its exceptions say exactly which check failed, which is
what the error reasons here need.

Every refusal is :class:`AuthError`: ``UNAUTHENTICATED`` with ErrorInfo reason
``TOKEN_MISSING``, ``TOKEN_INVALID`` or ``TOKEN_EXPIRED`` and a message that says what to fix,
whatever the token holds: a header with a ``kid`` that is not a string or with ``crit``, parts
that are not JSON, claims of any type and size (docs/operate/authentication.md). Neither the
token nor any part of it is ever put in a message or a log line.

The sources are read at start and again on SIGHUP (:meth:`Authenticator.reload`), as the TLS
files are (:mod:`turnwire_server.api.tls`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import jwt
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from turnwire_client.metadata import AUTHORIZATION_METADATA
from turnwire_server.access_settings import TENANT_PATTERN, AuthSettings, JwtSettings
from turnwire_server.api.caller import Caller
from turnwire_server.api.status import TurnwireStatusError

log = logging.getLogger("turnwire.auth")

_BEARER = re.compile(r"Bearer +([A-Za-z0-9\-._~+/]+=*) *", re.IGNORECASE)
"""``Bearer`` and a b64token (RFC 6750 §2.1); the scheme name is case-insensitive (RFC 9110 §11.1)."""

_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
"""Three base64url parts: a JWS in compact serialization (RFC 7515 §7.1)."""


class AuthError(TurnwireStatusError):
    """A call refused for its credentials: ``UNAUTHENTICATED`` with an ErrorInfo ``reason``.

    ``cause``: for the refusal's log line only, never sent: the type of the exception a check
    raised on a token it could not handle (its message might quote the token)."""

    def __init__(self, reason: str, message: str, *, cause: str = "") -> None:
        super().__init__(grpc.StatusCode.UNAUTHENTICATED, message, reason=reason)
        self.cause = cause


class AuthConfigError(Exception):
    """``auth:`` names a file or variable that cannot be read or holds no valid document."""


class _TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    token: str | None = Field(None, min_length=16)
    principal: str = Field(min_length=1, max_length=256)
    tenant: str = Field(pattern=TENANT_PATTERN)

    @model_validator(mode="after")
    def _one_secret(self) -> _TokenEntry:
        if (self.sha256 is None) == (self.token is None):
            raise ValueError("give exactly one of sha256 (preferred) and token")
        return self

    def digest(self) -> bytes:
        if self.sha256 is not None:
            return bytes.fromhex(self.sha256)
        assert self.token is not None
        return hashlib.sha256(self.token.encode()).digest()


class _TokenDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[_TokenEntry]


@dataclass(frozen=True, slots=True)
class _StaticToken:
    digest: bytes
    caller: Caller


class StaticTokens:
    """Static tokens by SHA-256 digest. Build with :meth:`parse`."""

    def __init__(self, entries: Sequence[_StaticToken]) -> None:
        self._entries = tuple(entries)

    @classmethod
    def parse(cls, text: str, origin: str) -> StaticTokens:
        """The tokens of a YAML or JSON document (see the module docstring). Raises
        :class:`AuthConfigError` naming ``origin`` and the bad entry, never a token."""
        try:
            document = _TokenDocument.model_validate(yaml.safe_load(text))
        except yaml.YAMLError as error:
            raise AuthConfigError(f"{origin} is not YAML or JSON ({type(error).__name__})") from None
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, item['loc'])) or '(top level)'}: {item['msg']}"
                for item in error.errors()
            )
            raise AuthConfigError(f"{origin}: {problems}") from None
        return cls(
            [_StaticToken(entry.digest(), Caller(entry.principal, entry.tenant)) for entry in document.tokens]
        )

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token: str) -> Caller | None:
        """The caller of ``token``, or None. Compares with every entry in constant time."""
        digest = hashlib.sha256(token.encode()).digest()
        found: Caller | None = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry.caller
        return found


class JwtVerifier:
    """Verifies JWTs against a key set (see the module docstring). Build with :meth:`load`."""

    def __init__(self, settings: JwtSettings, keys: jwt.PyJWKSet) -> None:
        self.settings = settings
        self._keys = keys

    @classmethod
    def load(cls, settings: JwtSettings) -> JwtVerifier:
        """Read ``settings.jwks_file``. Raises :class:`AuthConfigError` for a file that cannot be
        read, is not a JWKS, or holds a symmetric (``oct``) or private key."""
        path = settings.jwks_file
        try:
            text = path.read_text(encoding="utf-8")
            document = json.loads(text)
            keys = jwt.PyJWKSet.from_dict(document)
        except OSError as error:
            raise AuthConfigError(f"auth.jwt.jwks_file {path}: {error.strerror or error}") from None
        except (ValueError, jwt.PyJWKSetError, jwt.InvalidKeyError) as error:
            raise AuthConfigError(f"auth.jwt.jwks_file {path} is not a JSON Web Key Set: {error}") from None
        for entry in document.get("keys", ()):
            if entry.get("kty") == "oct" or "d" in entry:
                raise AuthConfigError(
                    f"auth.jwt.jwks_file {path} holds a symmetric or private key "
                    f"(kid {entry.get('kid')!r}); it must hold public keys only"
                )
        return cls(settings, keys)

    def __len__(self) -> int:
        return len(self._keys.keys)

    def verify(self, token: str) -> Caller:
        """The caller a valid token names. Raises :class:`AuthError`."""
        settings = self.settings
        key = self._key_of(_header_of(token))
        try:
            claims = jwt.decode(
                token,
                key=key,
                algorithms=list(settings.algorithms),
                audience=settings.audience,
                issuer=settings.issuer,
                leeway=settings.leeway_seconds,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("TOKEN_EXPIRED", "the bearer token has expired (exp); get a new one") from None
        except jwt.ImmatureSignatureError:
            raise AuthError(
                "TOKEN_INVALID", "the bearer token is not valid yet (nbf or iat in the future); check clocks"
            ) from None
        except jwt.InvalidAudienceError:
            raise AuthError(
                "TOKEN_INVALID",
                f"the bearer token's audience (aud) does not include {settings.audience!r}; "
                "get a token issued for this server",
            ) from None
        except jwt.InvalidIssuerError:
            raise AuthError(
                "TOKEN_INVALID", f"the bearer token's issuer (iss) is not {settings.issuer!r}"
            ) from None
        except jwt.MissingRequiredClaimError as error:
            raise AuthError(
                "TOKEN_INVALID", f"the bearer token lacks the required claim {error.claim!r}"
            ) from None
        except jwt.InvalidAlgorithmError:
            raise AuthError(
                "TOKEN_INVALID",
                "the bearer token is signed with an algorithm this server does not accept for its key "
                f"(auth.jwt.algorithms: {', '.join(settings.algorithms)})",
            ) from None
        except jwt.InvalidSignatureError:
            raise AuthError(
                "TOKEN_INVALID", "the bearer token's signature does not verify with the configured key set"
            ) from None
        except jwt.InvalidTokenError:
            raise AuthError("TOKEN_INVALID", "the bearer token is not a valid JWT") from None
        except Exception as error:  # the token is the client's, whatever it breaks
            # PyJWT converts exp, nbf and iat with int(); which errors of that it wraps differs
            # between the releases pyproject allows (>=2.10), and any escape would end the call
            # UNKNOWN with a traceback.
            raise AuthError(
                "TOKEN_INVALID",
                "the bearer token is not a valid JWT: its claims cannot be checked",
                cause=type(error).__name__,
            ) from None
        return self._caller_of(claims)

    def _key_of(self, header: Mapping[str, Any]) -> jwt.PyJWK:
        kid = header.get("kid")
        if isinstance(kid, str):
            try:
                return self._keys[kid]
            except KeyError:
                pass
        elif kid is None and len(self._keys.keys) == 1:
            return self._keys.keys[0]
        raise AuthError(
            "TOKEN_INVALID",
            "the bearer token's key id (kid) names no key of the configured key set (auth.jwt.jwks_file)",
        )

    def _caller_of(self, claims: Mapping[str, Any]) -> Caller:
        name = self.settings.tenant_claim
        tenant = claims.get(name)
        if not isinstance(tenant, str) or not re.fullmatch(TENANT_PATTERN, tenant):
            raise AuthError(
                "TOKEN_INVALID",
                f"the bearer token's claim {name!r} (auth.jwt.tenant_claim) must name a tenant: "
                "1-64 characters of [A-Za-z0-9._:-]",
            )
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise AuthError("TOKEN_INVALID", "the bearer token's subject (sub) must be a non-empty string")
        return Caller(principal=subject, tenant=tenant)


class Authenticator:
    """Maps a call's metadata to its :class:`Caller`. Build with :meth:`from_settings`.

    :meth:`reload` (SIGHUP) re-reads ``auth.tokens_file`` and ``auth.jwt.jwks_file``: a token
    removed from the file, or signed by a key removed from the set, is refused from the next
    call on. Calls already authenticated (an open stream) run to their end."""

    def __init__(self, settings: AuthSettings, environ: Mapping[str, str]) -> None:
        self._settings = settings
        self._environ = environ
        self._static, self._jwts = self._load()

    @classmethod
    def from_settings(cls, settings: AuthSettings, environ: Mapping[str, str] = os.environ) -> Authenticator:
        """Load the configured token sources. Raises :class:`AuthConfigError`."""
        return cls(settings, environ)

    def reload(self) -> bool:
        """Re-read the token sources now (SIGHUP). True when they loaded; False when one did not
        (logged, naming the file and the fault, never a token; the sources in use stay)."""
        try:
            self._static, self._jwts = self._load()
        except AuthConfigError as error:
            log.error("auth: token sources not reloaded, still using the previous ones: %s", error)
            return False
        sources = [f"{len(self._static or ())} static token(s)"]
        if self._jwts is not None:
            sources.append(f"{len(self._jwts)} JWT key(s) from {self._jwts.settings.jwks_file}")
        log.info("auth: token sources reloaded (SIGHUP): %s", ", ".join(sources))
        return True

    def _load(self) -> tuple[StaticTokens | None, JwtVerifier | None]:
        settings, environ = self._settings, self._environ
        static: list[_StaticToken] = []
        if settings.tokens_file is not None:
            path = settings.tokens_file
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as error:
                raise AuthConfigError(f"auth.tokens_file {path}: {error.strerror or error}") from None
            static.extend(StaticTokens.parse(text, f"auth.tokens_file {path}")._entries)
        if settings.tokens_env is not None:
            name = settings.tokens_env
            if name not in environ:
                raise AuthConfigError(f"auth.tokens_env: the variable {name} is not set")
            static.extend(StaticTokens.parse(environ[name], f"auth.tokens_env {name}")._entries)
        jwts = JwtVerifier.load(settings.jwt) if settings.jwt is not None else None
        return StaticTokens(static) if static else None, jwts

    def authenticate(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Caller:
        """The caller of a call with this invocation metadata. Raises :class:`AuthError`."""
        values = [value for key, value in metadata or () if key == AUTHORIZATION_METADATA]
        if not values:
            raise AuthError(
                "TOKEN_MISSING",
                "this call needs a bearer token: send the metadata 'authorization: Bearer <token>'",
            )
        value = values[0]
        matched = _BEARER.fullmatch(value) if isinstance(value, str) and len(values) == 1 else None
        if matched is None:
            raise AuthError(
                "TOKEN_INVALID",
                "the authorization metadata must be exactly one value 'Bearer <token>' (RFC 6750)",
            )
        token = matched.group(1)
        if self._static is not None:
            caller = self._static.lookup(token)
            if caller is not None:
                return caller
        if self._jwts is not None and _JWT_SHAPE.fullmatch(token):
            return self._jwts.verify(token)
        raise AuthError(
            "TOKEN_INVALID",
            "the bearer token is not one this server accepts"
            + (" (no configured static token, and not a JWT)" if self._jwts is not None else ""),
        )


def _header_of(token: str) -> dict[str, Any]:
    """The JOSE header of a compact JWS (RFC 7515 §7.1). Raises :class:`AuthError` for one that is
    not a base64url JSON object, a ``kid`` that is not a string (§4.1.4) and any ``crit``
    (§4.1.11: a recipient must refuse critical extensions it does not understand, and this server
    understands none). PyJWT raises these outside its ``DecodeError``, and quotes the header."""
    encoded = token.partition(".")[0]
    try:
        header = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (ValueError, RecursionError):  # base64, UTF-8 and JSON errors are all ValueErrors
        header = None
    if not isinstance(header, dict):
        raise AuthError(
            "TOKEN_INVALID", "the bearer token is not a well-formed JWT: its header is not a JSON object"
        )
    if not isinstance(header.get("kid", ""), str):
        raise AuthError("TOKEN_INVALID", "the bearer token's key id (kid) must be a string")
    if "crit" in header:
        raise AuthError(
            "TOKEN_INVALID",
            "the bearer token's header marks extensions critical (crit); this server supports none, "
            "so it refuses the token (RFC 7515 §4.1.11)",
        )
    return header


def token_digest(token: str) -> str:
    """The hex SHA-256 of ``token``: what a tokens file lists under ``sha256``."""
    return hashlib.sha256(token.encode()).hexdigest()
