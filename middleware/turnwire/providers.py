"""The provider interface: stream one model step from a normalized request.

A provider adapter turns a :class:`ModelRequest` (provider-neutral transcript,
tool definitions, settings) into the provider's wire request, and the
provider's stream into :data:`turnwire.types.ModelChunk` values. The engine
consumes only these types; it never imports a concrete provider. Every stream
ends with exactly one :class:`~turnwire.types.FinishStep` unless it raises
:class:`ProviderError`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from turnwire.errors import CanonicalCode, DomainError
from turnwire.types import ModelChunk, ModelSettings, ToolChoice, ToolDefinition
from turnwire_client.v1 import error_reason_pb2, message_pb2

CONTINUATION_PROMPT = (
    "Continue your previous response from exactly where it left off. Do not repeat any of it."
)
"""The user message the engine adds (never stored) after a history that ends in an assistant
message with content, so the model continues that reply (docs/semantics.md §1): a provider sees
it as the last message of :attr:`ModelRequest.messages`."""


def transcript_call_ids(messages: Iterable[message_pb2.Message]) -> set[str]:
    """The tool call ids of every assistant message in ``messages`` (what a step's new calls must not
    reuse: :func:`unique_id`)."""
    return {
        part.tool_call.tool_call_id
        for message in messages
        if message.role == message_pb2.ROLE_ASSISTANT
        for part in message.parts
        if part.WhichOneof("kind") == "tool_call"
    }


def unique_id(base: str, taken: set[str]) -> str:
    """``base``, or the first of ``<base>_2``, ``<base>_3`` … not in ``taken``; the id returned is
    added to ``taken``. How a tool call id a request's transcript (or an earlier call of the step)
    already holds is made the call's own (docs/providers.md, "Tool call ids"; docs/semantics.md
    §11): a provider whose API repeats ids, or that numbers them per response or per turn, gives
    each call this id instead."""
    candidate, count = base, 1
    while candidate in taken:
        count += 1
        candidate = f"{base}_{count}"
    taken.add(candidate)
    return candidate


@dataclass(slots=True)
class ModelRequest:
    """Everything one model step needs.

    ``model`` is the provider-local model name (the part after ``provider:``).
    ``messages`` is the provider-neutral transcript (proto ``Message``s, oldest
    first, already repaired so every tool call has its result); the adapter
    converts it to its wire format. The messages are read-only and shared with other
    requests (the history is not copied per turn, issue 17): an adapter never changes them,
    and may keep a conversion by message object. ``step_number`` is the 0-based step within
    the turn (adapters may ignore it; the scripted model uses it). ``attempt`` is the
    turn's attempt, from 1; a recovery after a stall or a crash runs attempt 2 and later
    (docs/semantics.md §8, §12). ``cache_key`` is an opaque key of the conversation, the same
    for all its steps and turns ("" for none): adapters give it to a provider's prompt cache
    (OpenAI's ``prompt_cache_key``), never a conversation id.
    """

    model: str
    system: str
    messages: Sequence[message_pb2.Message]
    tools: Sequence[ToolDefinition] = ()
    tool_choice: ToolChoice = "auto"
    settings: ModelSettings = field(default_factory=ModelSettings)
    output_schema: Mapping[str, Any] | None = None
    step_number: int = 0
    attempt: int = 1
    cache_key: str = ""


class ProviderError(DomainError):
    """A provider call failed, normalized across providers (reason ``PROVIDER_ERROR``).

    ``status`` is the HTTP status (0 when none, e.g. an in-stream error or a
    dropped connection), ``type``/``code`` the provider's own error type and
    code, ``retryable`` whether the same request may succeed later,
    ``retry_after_seconds`` how long to wait when the provider said so, ``body`` the raw
    error body for ``classify_chat_error``, ``in_stream`` whether it arrived inside a stream: in
    the body of a 2xx response the provider had already begun (an error event, a stream cut short
    or unreadable, a connection dropped while reading it) rather than as an error status before
    any output. :mod:`turnwire.error_classes` reads these fields: the class, the coarse
    classification and the overflow remedy of an error; the API layer reads them too, for the
    status the client gets (``UNAVAILABLE`` by default, refined by that classification).
    """

    error_reason = error_reason_pb2.ERROR_REASON_PROVIDER_ERROR
    status_code = CanonicalCode.UNAVAILABLE

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        type: str = "",
        code: str = "",
        retryable: bool = False,
        retry_after_seconds: float | None = None,
        body: Any = None,
        provider: str = "",
        in_stream: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.retryable = retryable
        self.retry_after_seconds = retry_after_seconds
        self.body = body
        self.provider = provider
        self.in_stream = in_stream
        self.endpoint: str | None = None
        """The ``"POST http://host/path"`` the message names, for operators (logs, spans): the
        client's text leaves it out (:attr:`client_message`)."""

    @property
    def client_message(self) -> str:
        """The message without the endpoint called (the provider's host is the operator's, not
        the client's: docs/security.md); a 404's "check base_url" hint stays. Where the HTTP
        library's own text quotes the address it could not reach (``Cannot connect to host
        HOST:PORT … [Connect call failed ('IP', PORT)]``), the address is ``***``."""
        message = self.message
        if self.endpoint:
            message = message.replace(f"({self.endpoint}; ", "(").replace(f" ({self.endpoint})", "")
            message = _without_address(message, self.endpoint)
        return f"model provider error: {_SOCKET_ADDRESS.sub('***', message)}"

    def redact(self, redact: Callable[[str], str]) -> ProviderError:
        """Mask this error's provider text in place with ``redact`` (a secret-masking function):
        the message (and ``args``), ``type``, ``code`` and every string in ``body``, at any depth;
        its chained cause (the SDK's exception, quoting the same text) is dropped. Returns
        ``self``. The sidecar applies it where a provider's error enters a turn, so what the
        client, the store, spans and logs get is masked (docs/security.md, "Secrets")."""
        self.message = redact(self.message)
        self.args = (self.message,)
        self.type = redact(self.type)
        self.code = redact(self.code)
        self.body = _redact_strings(self.body, redact)
        self.__cause__ = None
        self.__suppress_context__ = True
        return self


_SOCKET_ADDRESS = re.compile(
    r"\('(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]*:[0-9A-Fa-f:.%\w]*)', \d+(?:, \d+, \d+)?\)"
)
"""A socket address as Python prints it, ``('127.0.0.1', 8000)`` or ``('::1', 8000, 0, 0)``: what
asyncio's "Connect call failed" quotes (the provider's resolved address)."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _without_address(message: str, endpoint: str) -> str:
    """``message`` with the host and port of ``endpoint`` (``"POST http://host:port/path"``) as
    ``***`` wherever it quotes them together (``host:port``, as HTTP libraries name the address
    they could not reach; the port is the scheme's when the URL has none). A bare host name is
    left alone: it may be an ordinary word of the message (a provider entry of the same name)."""
    url = urlsplit(endpoint.partition(" ")[2])
    try:
        host, port = url.hostname, url.port or _DEFAULT_PORTS.get(url.scheme)
    except ValueError:  # a port that is not a number: no address to look for
        return message
    addresses = {url.netloc.rpartition("@")[2]}
    if host and port:
        addresses |= {f"{host}:{port}", f"[{host}]:{port}"}
    for address in sorted(addresses, key=len, reverse=True):
        if address and ":" in address:
            message = message.replace(address, "***")
    return message


def _redact_strings(value: Any, redact: Callable[[str], str]) -> Any:
    """``value`` (parsed JSON or text) with ``redact`` applied to every string, keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_redact_strings(key, redact): _redact_strings(item, redact) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_strings(item, redact) for item in value]
    return value


@runtime_checkable
class Provider(Protocol):
    """A model provider: streams one model step.

    Implementations: ``turnwire.testing.ScriptedProvider`` (offline);
    the official-SDK adapters follow. ``stream`` yields :data:`ModelChunk`s,
    ending with one :class:`FinishStep`, and raises :class:`ProviderError` on
    failure. Closing the iterator (``aclose``) must stop the underlying HTTP
    stream at once.

    Optional: an adapter whose requests may write a prompt cache billed above the input price
    has ``cache_writes(request: ModelRequest | None) -> "5m" | "1h" | None``, the longest
    lifetime a step of ``request`` (None: one not built yet) may write at; a budget in US
    dollars reserves its prompt at that write's price (docs/cost.md, "Budgets").
    """

    name: str

    def has_model(self, model: str) -> bool:
        """False when ``model`` is known not to exist (checked at admission); True when unsure."""
        ...

    def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        """Stream one step of model output for ``request``."""
        ...

    async def aclose(self) -> None:
        """Release clients and connections."""
        ...
