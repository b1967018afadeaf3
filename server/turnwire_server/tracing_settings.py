"""The ``tracing:`` section of the configuration (see :mod:`turnwire_server.config`), read by
:mod:`turnwire_server.trace_export`; declared apart from it so that reading the configuration
does not import the OpenTelemetry SDK."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from turnwire_server.config_section import ConfigSection


class TracingSettings(ConfigSection):
    """OpenTelemetry traces, exported over OTLP/gRPC (off by default; docs/operate/traces.md).

    A span per turn, model call, tool call and hook call, by the GenAI semantic conventions
    (:mod:`turnwire_server.engine.tracing`). A field left unset falls back to the SDK's
    standard variable: ``endpoint`` to ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (else ``http://localhost:4317``), ``headers`` to
    ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``, ``insecure`` to the endpoint's scheme (``http``:
    plaintext) or ``OTEL_EXPORTER_OTLP_(TRACES_)INSECURE``, ``ca_file`` to
    ``OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE``, ``service_name`` to ``OTEL_SERVICE_NAME``
    (else ``turnwire``), ``sampler_ratio`` to ``OTEL_TRACES_SAMPLER`` (else every trace, or as
    the caller's ``traceparent`` decided). ``headers`` values are secrets: never logged or shown.
    ``capture_message_content`` records prompts, replies and tool inputs and outputs in spans
    (the conventions' opt-in attributes). An ``endpoint`` without ``http://`` or ``https://``
    needs ``insecure`` set: the exporter would take it for TLS, and a plaintext collector
    (``otel-collector:4317``, as collectors are often named) would get no span, only a
    handshake error per export.
    """

    enabled: bool = False
    endpoint: str | None = Field(
        None, min_length=1, description="OTLP/gRPC collector, e.g. http://127.0.0.1:4317"
    )
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="sent with every export")
    insecure: bool | None = Field(None, description="plaintext gRPC to the collector")
    ca_file: Path | None = Field(
        None, description="PEM file of the CA that signed the collector's certificate"
    )
    service_name: str | None = Field(None, min_length=1, description="the service.name resource attribute")
    sampler_ratio: float | None = Field(
        None, ge=0, le=1, description="share of new traces recorded (parent-based: a caller's decision wins)"
    )
    capture_message_content: bool = Field(False, description="record message content in spans")

    @model_validator(mode="after")
    def _transport_is_said(self) -> TracingSettings:
        endpoint = self.endpoint
        if (
            endpoint is not None
            and self.insecure is None
            and not endpoint.startswith(("http://", "https://"))
        ):
            raise ValueError(
                f"endpoint {endpoint!r} has no scheme, so spans would go over TLS: write "
                f"http://{endpoint} for a plaintext collector or https://{endpoint} for TLS "
                "(or set tracing.insecure)"
            )
        return self

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value
