"""The ``tools:`` section of the configuration (:class:`ToolsSettings`) and its entries for the
tool sources in other processes: ``tools.hosts`` and ``tools.mcp``.

A **tool host** is a process serving ``turnwire.v1.ToolExecutorService`` (protos/turnwire/v1/tools.proto);
an **MCP server** is a Model Context Protocol server reached over stdio (a command the sidecar
starts) or streamable HTTP (a URL). Their tools join the server's tools in config order, hosts
first, then MCP servers (docs/semantics.md §2; docs/tools.md). Times are in seconds.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from turnwire_server.config_section import ConfigSection
from turnwire_server.redaction import secret
from turnwire_server.url_check import check_http_url

SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What a tool host's or MCP server's ``name`` may be (it appears in logs and tool errors)."""


def _source_name(value: str) -> str:
    if not SOURCE_NAME.fullmatch(value):
        raise ValueError("must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return value


class TlsSettings(ConfigSection):
    """TLS towards a tool host. Present (even empty, ``tls: {}``): TLS with the system's root
    certificates; absent: plaintext. Files are PEM, read at start (a missing one stops start-up)."""

    ca_file: Path | None = Field(None, description="root certificates to trust instead of the system's")
    cert_file: Path | None = Field(None, description="client certificate chain (mutual TLS), with key_file")
    key_file: Path | None = Field(None, description="client private key (mutual TLS), with cert_file")
    server_name: str | None = Field(
        None, min_length=1, description="the name checked against the host's certificate (default: address)"
    )

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self


class ToolHostSettings(ConfigSection):
    """One ToolExecutorService host. ``address`` is any gRPC target (``host:port``,
    ``dns:///name:port``, ``unix:///path``). ``timeout_seconds`` bounds each call of a tool whose
    ``ToolSpec.timeout`` is unset (default: ``limits.tool_timeout_seconds``);
    ``startup_timeout_seconds`` bounds the first ``ListTools`` (a host that does not answer in
    time does not stop start-up: its tools join once it answers); ``refresh_interval_seconds``
    re-lists periodically besides on every reconnection (0: only on reconnection)."""

    name: str
    address: str = Field(min_length=1)
    tls: TlsSettings | None = None
    timeout_seconds: float | None = Field(None, gt=0)
    startup_timeout_seconds: float = Field(5.0, gt=0)
    refresh_interval_seconds: float = Field(60.0, ge=0)

    _name = field_validator("name")(_source_name)


class McpServerSettings(ConfigSection):
    """One MCP server: either ``command`` (stdio: the sidecar starts it, with ``args``, ``env``
    added to its environment, ``cwd``) or ``url`` (streamable HTTP, with ``headers`` on every
    request). ``timeout_seconds`` bounds each call (default: ``limits.tool_timeout_seconds``);
    ``startup_timeout_seconds`` bounds connecting and listing at start (a server not ready in
    time does not stop start-up: its tools join once it is)."""

    name: str
    command: str | None = Field(None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=secret("values"))
    cwd: Path | None = None
    url: str | None = Field(None, min_length=1, json_schema_extra=secret("url"))
    headers: dict[str, str] = Field(default_factory=dict, json_schema_extra=secret("values"))
    timeout_seconds: float | None = Field(None, gt=0)
    startup_timeout_seconds: float = Field(10.0, gt=0)

    _name = field_validator("name")(_source_name)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return check_http_url(value, "http://127.0.0.1:8000/mcp (the streamable HTTP endpoint)")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        if self.command is None and (self.args or self.env or self.cwd is not None):
            raise ValueError("args, env and cwd are for a stdio server (command), not a url")
        if self.url is None and self.headers:
            raise ValueError("headers are for a streamable HTTP server (url), not a command")
        return self


class ToolsSettings(ConfigSection):
    """Server-side tools. ``demo`` enables the demo tools (on by default; start-up warns when the
    default model is not a scripted one and ``demo`` was not set explicitly); ``python`` lists dotted paths
    (``package.module:attribute``) of Tool objects, or of callables returning one or a list;
    ``hosts`` lists ToolExecutorService hosts and ``mcp`` MCP servers, whose tools join after
    those, in this order (docs/semantics.md §2, docs/tools.md); ``require_approval`` names tools
    of any source whose every call waits for the client's approval (docs/semantics.md §6)."""

    demo: bool = True
    python: list[str] = Field(default_factory=list)
    hosts: list[ToolHostSettings] = Field(default_factory=list)
    mcp: list[McpServerSettings] = Field(default_factory=list)
    require_approval: list[str] = Field(
        default_factory=list, description="tools whose calls wait for the client's approval"
    )

    @model_validator(mode="after")
    def _unique_source_names(self) -> ToolsSettings:
        names = [host.name for host in self.hosts] + [server.name for server in self.mcp]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"hosts and mcp entries need distinct names; repeated: {', '.join(repeated)}")
        return self
