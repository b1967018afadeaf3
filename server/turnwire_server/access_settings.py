"""The ``auth:`` and ``rate_limits:`` sections of the configuration (see :mod:`turnwire_server.config`).

Both are off by default. What they do is described in docs/operate/authentication.md and
docs/operate/rate-limits.md, and in :mod:`turnwire_server.api.access`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from turnwire_server.config_section import ConfigSection
from turnwire_server.redaction import secret

AsymmetricAlgorithm = Literal[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"
]
"""JWS algorithms a JWT may be signed with (RFC 7518 §3.1, RFC 8037): public-key ones only, so a
key set on disk holds no secret and no HS*/RS* confusion is possible (RFC 8725 §2.1)."""

_DEFAULT_ALGORITHMS: tuple[AsymmetricAlgorithm, ...] = ("RS256", "ES256", "EdDSA")

TENANT_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
"""A tenant name: the id alphabet without ``/`` (it separates the tenant in store keys)."""


class JwtSettings(ConfigSection):
    """JWT bearer tokens verified against a JSON Web Key Set file (RFC 7517 §5) on disk."""

    jwks_file: Path = Field(description="JWKS file (JSON, public keys only; re-read at start)")
    issuer: str = Field(min_length=1, description="the required `iss` claim")
    audience: str = Field(min_length=1, description="the `aud` claim must contain this")
    algorithms: list[AsymmetricAlgorithm] = Field(
        default_factory=lambda: list(_DEFAULT_ALGORITHMS), min_length=1
    )
    tenant_claim: str = Field("tenant", min_length=1, description="the claim naming the caller's tenant")
    leeway_seconds: float = Field(30.0, ge=0, le=300, description="clock skew allowed on exp and nbf")


class AuthSettings(ConfigSection):
    """``auth:``: bearer tokens in the ``authorization`` metadata of every call."""

    enabled: bool = False
    tokens_file: Path | None = Field(
        None, description="YAML/JSON file of static tokens (sha256 or token → principal, tenant)"
    )
    tokens_env: str | None = Field(
        None,
        min_length=1,
        description="environment variable holding the same document as tokens_file",
        json_schema_extra=secret("env"),  # its value may list plain tokens: masked in logs
    )
    jwt: JwtSettings | None = None
    open_health: bool = Field(True, description="the health service answers without a token")
    open_reflection: bool = Field(True, description="the reflection service answers without a token")

    @model_validator(mode="after")
    def _has_a_source(self) -> AuthSettings:
        if self.enabled and self.tokens_file is None and self.tokens_env is None and self.jwt is None:
            raise ValueError("auth.enabled needs tokens_file, tokens_env or jwt")
        return self


class RateLimit(ConfigSection):
    """Limits per principal per minute; 0 is no limit."""

    turns_per_minute: int = Field(0, ge=0)
    tokens_per_minute: int = Field(0, ge=0)


class RateLimitSettings(RateLimit):
    """``rate_limits:``: the default for every principal, and overrides by principal or tenant
    (a principal's entry wins over its tenant's)."""

    principals: dict[str, RateLimit] = Field(default_factory=dict)
    tenants: dict[str, RateLimit] = Field(default_factory=dict)

    def for_caller(self, principal: str, tenant: str) -> RateLimit:
        """The limits of ``principal`` in ``tenant``."""
        return self.principals.get(principal) or self.tenants.get(tenant) or self

    @property
    def enabled(self) -> bool:
        """True when any limit is set."""
        limits = [self, *self.principals.values(), *self.tenants.values()]
        return any(limit.turns_per_minute or limit.tokens_per_minute for limit in limits)
