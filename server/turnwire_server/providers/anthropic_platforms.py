"""Claude on Amazon Bedrock and Google Vertex AI: the Messages adapter on the ``anthropic`` SDK's own
platform clients (``AsyncAnthropicBedrock``, ``AsyncAnthropicVertex``).

Both platforms take the Messages API's request body and stream its events, so the request builder
and :class:`~turnwire_server.providers.anthropic_messages.AnthropicDecoder` are the Anthropic
adapter's; what differs is said here and done by the SDK client:

- **Where the request goes.** The SDK client moves the model (and for Bedrock the ``stream`` flag)
  from the body into the URL and adds the body's ``anthropic_version``: Bedrock
  ``POST /model/{model}/invoke-with-response-stream``, Vertex AI ``POST
  /projects/{project}/locations/{location}/publishers/anthropic/models/{model}:streamRawPredict``.
  A step posted as JSON (the kept-encoding path, :mod:`~turnwire_server.providers.json_body`) gets
  that path and those fields from the SDK's own option preparation, applied to the model alone
  (never to the transcript, which it would deep-copy), so the URL and body are the SDK's.
- **Authentication.** The SDK client signs each request: Bedrock with SigV4 from the AWS default
  credential chain (botocore; or ``AWS_BEARER_TOKEN_BEDROCK``), Vertex AI with a bearer token from
  Google Application Default Credentials (google-auth). A chain that finds no credentials fails
  the step with a non-retryable ``authentication_error`` naming where the credentials are looked
  for; the credentials themselves never appear.
- **The stream.** Vertex AI streams server-sent events as Anthropic does; Bedrock the AWS event
  stream (:mod:`~turnwire_server.providers.aws_event_stream`), whose exception messages
  (``throttlingException`` …) become in-stream errors.
- **Token counting.** Vertex AI has ``count-tokens:rawPredict`` (the SDK's ``messages.count_tokens``);
  the SDK has none for Bedrock: :meth:`BedrockMessagesProvider.count_tokens` returns None (the
  compaction falls back to its estimate).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import anthropic
from anthropic._models import FinalRequestOptions

from turnwire.providers import ModelRequest, ProviderError
from turnwire_server.providers import errors
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.aws_event_stream import iter_bedrock_events

ROUTES_KEPT = 256
"""Model names whose path and platform fields are kept per provider (a step's model is one of a
few; a caller naming endless models only recomputes them)."""


class _PlatformMessages(AnthropicMessagesProvider):
    """The Messages adapter on a platform client whose SDK routes ``/v1/messages`` itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._route = functools.lru_cache(maxsize=ROUTES_KEPT)(self._sdk_route)

    def _sdk_route(self, model: str) -> tuple[str, dict[str, Any]]:
        """The SDK's path for a streamed ``model`` call and the fields it adds to the body."""
        raise NotImplementedError

    def _json_post(self, kwargs: dict[str, Any], extra_body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        path, fields = self._route(str(kwargs["model"]))
        body = {key: value for key, value in kwargs.items() if key != "model"}
        return path, {**body, **fields, **extra_body}

    def _credentials_error(self, error: BaseException) -> ProviderError | None:
        """A credential chain that failed before the request was sent, or None."""
        raise NotImplementedError

    def _map_error(self, error: BaseException) -> ProviderError | None:
        return super()._map_error(error) or self._credentials_error(error)


def _fields(json_data: object) -> dict[str, Any]:
    """The body fields the SDK's preparation left (``anthropic_version`` …), the model taken out."""
    return dict(json_data) if isinstance(json_data, dict) else {}


class BedrockMessagesProvider(_PlatformMessages):
    """Streams steps from Claude on Amazon Bedrock through ``client`` (an ``AsyncAnthropicBedrock``);
    options as :class:`AnthropicMessagesProvider`'s."""

    type = "bedrock"

    def _sdk_route(self, model: str) -> tuple[str, dict[str, Any]]:
        from anthropic.lib.bedrock._client import _prepare_options

        options = FinalRequestOptions.construct(
            method="post", url="/v1/messages", json_data={"model": model, "stream": True}
        )
        prepared = _prepare_options(options, self.client._custom_headers)
        return prepared.url, _fields(prepared.json_data)

    def _events(self, body: AsyncIterator[bytes]) -> AsyncIterator[tuple[bytes, bytes]]:
        return iter_bedrock_events(self.name, body)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """None: the SDK's Bedrock client has no token counting (its ``count_tokens`` raises)."""
        return None

    def _credentials_error(self, error: BaseException) -> ProviderError | None:
        from botocore.exceptions import BotoCoreError

        # The SDK raises RuntimeError("Could not resolve AWS credentials from session").
        if isinstance(error, BotoCoreError) or (
            isinstance(error, RuntimeError) and "credentials" in str(error)
        ):
            return errors.no_credentials(self.name, errors.AWS_CREDENTIALS, error)
        return None


class VertexMessagesProvider(_PlatformMessages):
    """Streams steps from Claude on Google Vertex AI through ``client`` (an ``AsyncAnthropicVertex``);
    options as :class:`AnthropicMessagesProvider`'s."""

    type = "vertex"

    def _sdk_route(self, model: str) -> tuple[str, dict[str, Any]]:
        from anthropic.lib.vertex._client import _prepare_options

        options = FinalRequestOptions.construct(
            method="post", url="/v1/messages", json_data={"model": model, "stream": True}
        )
        client = self.client
        assert isinstance(client, anthropic.AsyncAnthropicVertex)
        prepared = _prepare_options(options, project_id=client.project_id, region=client.region)
        return prepared.url, _fields(prepared.json_data)

    def _credentials_error(self, error: BaseException) -> ProviderError | None:
        from google.auth.exceptions import GoogleAuthError, TransportError

        if isinstance(error, TransportError):
            # The token endpoint or metadata server did not answer: the next try may get a token.
            failure = errors.no_credentials(self.name, errors.GOOGLE_CREDENTIALS, error)
            failure.retryable = True
            return failure
        if isinstance(error, GoogleAuthError) or (
            isinstance(error, RuntimeError) and "API token" in str(error)
        ):
            return errors.no_credentials(self.name, errors.GOOGLE_CREDENTIALS, error)
        return None
