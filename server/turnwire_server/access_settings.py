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

    @property
    def limited(self) -> bool:
        """True when either limit is set."""
        return bool(self.turns_per_minute or self.tokens_per_minute)


_LIMITS = frozenset(RateLimit.model_fields)


class TenantRateLimit(RateLimit):
    """``rate_limits.tenants.<tenant>``: the limits of each principal of that tenant, and
    overrides for some of its principals by name (``principals:``, which win). A limit an entry
    does not give is the one above it."""

    principals: dict[str, RateLimit] = Field(default_factory=dict)


class RateLimitSettings(RateLimit):
    """``rate_limits:``: the default for every principal, and overrides by tenant and, within a
    tenant, by principal (docs/operate/rate-limits.md). A principal is one name in one tenant:
    its windows are its own, whatever other tenants' principals are called."""

    tenants: dict[str, TenantRateLimit] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_principals_across_tenants(cls, data: object) -> object:
        # Before issue 32 a top-level `principals:` entry applied to the principal of that name in
        # every tenant (tenant B's `svc` got tenant A's override). It is refused rather than
        # reread with another meaning: the operator says which tenant's principal is meant.
        if isinstance(data, dict) and "principals" in data:
            names = ", ".join(sorted(map(str, data["principals"] or {}))) or "(none)"
            raise ValueError(
                "rate_limits.principals is no longer read: an override names a principal of one "
                "tenant. Move each entry under its tenant, as rate_limits.tenants.<tenant>."
                f"principals.<principal> (entries given: {names}); with authentication off every "
                "call is one anonymous principal, limited by the top-level limits"
            )
        return data

    def for_caller(self, principal: str, tenant: str) -> RateLimit:
        """The limits of ``principal`` in ``tenant``: each limit from the principal's entry under
        the tenant if it gives it, else from the tenant's entry if it does, else the default."""
        entry = self.tenants.get(tenant)
        if entry is None:
            return self
        limits = {name: getattr(self, name) for name in _LIMITS}
        for layer in (entry, entry.principals.get(principal)):
            if layer is not None:
                limits |= {name: getattr(layer, name) for name in layer.model_fields_set & _LIMITS}
        return RateLimit(**limits)

    @property
    def enabled(self) -> bool:
        """True when any limit is set."""
        entries = [*self.tenants.values()]
        limits = [self, *entries, *(p for entry in entries for p in entry.principals.values())]
        return any(limit.limited for limit in limits)


class TenantShare(ConfigSection):
    """The fractions of ``limits.max_concurrent_rpcs`` one tenant's calls may hold at once
    (0 < share <= 1; a tenant always gets at least one call of each kind)."""

    turn_calls: float = Field(
        0.5,
        gt=0,
        le=1,
        description="its running turns: its calls that run one (Chat, SaveMessages, ContinueLastTurn, "
        "SubmitToolResults, SubmitToolApprovals) and its turns running without a caller (left running "
        "under CONTINUE, submitted, recovered)",
    )
    streams: float = Field(
        0.5,
        gt=0,
        le=1,
        description="all its ChatService streams together: the turn calls, ResumeTurn and WatchSubmission",
    )

    @model_validator(mode="after")
    def _turn_calls_are_streams(self) -> TenantShare:
        if self.turn_calls > self.streams:
            raise ValueError(
                f"turn_calls ({self.turn_calls:g}) is above streams ({self.streams:g}): turn calls "
                "are streams too, so they can never reach it; give streams at least as much"
            )
        return self

    def calls(self, max_concurrent_rpcs: int) -> tuple[int, int]:
        """``(turn calls, streams)``: how many calls of each kind one tenant may hold of
        ``max_concurrent_rpcs``."""
        return (
            max(1, int(self.turn_calls * max_concurrent_rpcs)),
            max(1, int(self.streams * max_concurrent_rpcs)),
        )


class TenantShareSettings(TenantShare):
    """``tenant_shares:``: with authentication on, the part of the server's turn calls and
    streams each tenant may hold, so that one tenant cannot take every slot
    (docs/operate/authentication.md, "Tenants share the server"); overrides by tenant.
    Without authentication every call is one tenant's and only ``limits.max_concurrent_rpcs``
    applies."""

    tenants: dict[str, TenantShare] = Field(default_factory=dict)

    def for_tenant(self, tenant: str) -> TenantShare:
        """The shares of ``tenant``: its override, else the default."""
        return self.tenants.get(tenant, self)
