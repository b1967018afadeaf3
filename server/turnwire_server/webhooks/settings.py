"""The ``webhooks:`` section (docs/webhooks.md): named endpoints, whether a request may bring its
own URL, which addresses a call may reach, and how long and how often a delivery is retried.

Signing secrets are never in the file: each is read from the environment variable the section
names (``secret_env``), in the Standard Webhooks form (``whsec_`` and base64, as the
``standardwebhooks`` library reads it), and never logged or shown (``redaction.secret``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from turnwire_server.config_section import ConfigSection
from turnwire_server.redaction import secret
from turnwire_server.url_check import check_http_url, numeric_host_problem

__all__ = ["ENDPOINT_NAME", "WebhookEndpointSettings", "WebhookSettings"]

ENDPOINT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""An endpoint's name: 1-64 characters of ``[A-Za-z0-9_.-]``, starting with a letter or digit."""

_URL_EXAMPLE: Final = "https://app.example.com/hooks/turnwire"


class WebhookEndpointSettings(ConfigSection):
    """One named endpoint: where its calls go and the environment variable holding its secret."""

    url: str = Field(description="http(s) URL the calls are POSTed to")
    secret_env: str = Field(
        min_length=1,
        description="environment variable holding the endpoint's signing secret (whsec_…)",
        json_schema_extra=secret("env"),
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        check_http_url(value, _URL_EXAMPLE)
        if (problem := numeric_host_problem(urlsplit(value).hostname or "")) is not None:
            raise ValueError(problem)
        return value


class WebhookSettings(ConfigSection):
    """``webhooks:``. Calls go only to public addresses unless ``allowed_networks`` names the
    private, loopback or link-local networks that may be reached (checked on each resolved
    address, the one connected to); redirects are never followed.

    A delivery is retried (exponential backoff from ``initial_backoff_seconds``, doubling up to
    ``max_backoff_seconds``) until it is ``retry_period_seconds`` old; each attempt is bounded by
    ``timeout_seconds`` and reads at most ``max_response_bytes`` of the answer. Ended deliveries
    are kept ``retention_seconds`` (0: forever)."""

    endpoints: dict[str, WebhookEndpointSettings] = Field(default_factory=dict)
    allow_request_urls: bool = Field(
        False, description="a submission may give its own URL, signed with `secret_env`'s secret"
    )
    secret_env: str | None = Field(
        None,
        min_length=1,
        description="environment variable holding the server's own secret, for per-request URLs",
        json_schema_extra=secret("env"),
    )
    allowed_networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = Field(
        default_factory=list,
        description="non-public networks calls may reach (CIDR), e.g. 10.0.0.0/8; none by default",
    )
    retry_period_seconds: float = Field(86_400.0, ge=0, le=30 * 86_400)
    initial_backoff_seconds: float = Field(5.0, gt=0, le=86_400)
    max_backoff_seconds: float = Field(3_600.0, gt=0, le=86_400)
    timeout_seconds: float = Field(10.0, gt=0, le=120)
    max_response_bytes: int = Field(65_536, ge=0, le=16 << 20)
    poll_interval_seconds: float = Field(
        1.0, gt=0, le=60, description="how often due deliveries are looked for"
    )
    max_in_flight: int = Field(16, ge=1, le=1000, description="attempts one replica runs at once")
    retention_seconds: float = Field(7 * 86_400.0, ge=0)

    @field_validator("endpoints")
    @classmethod
    def _names(cls, value: dict[str, WebhookEndpointSettings]) -> dict[str, WebhookEndpointSettings]:
        for name in value:
            if not ENDPOINT_NAME.fullmatch(name):
                raise ValueError(
                    f"endpoint name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ . -, "
                    "starting with a letter or digit"
                )
        return value

    @model_validator(mode="after")
    def _request_urls_signed(self) -> WebhookSettings:
        if self.allow_request_urls and self.secret_env is None:
            raise ValueError(
                "allow_request_urls needs secret_env: the environment variable holding the secret "
                "that signs calls to per-request URLs"
            )
        return self

    @property
    def lease_seconds(self) -> float:
        """How long a claimed delivery stays with its replica: one attempt's bound and a margin;
        after it, another replica may take the delivery over (its replica presumably died)."""
        return self.timeout_seconds + 5.0
