"""Fixtures: a replay server per test, and adapters wired to it through the official SDKs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anthropic
import openai
import pytest

from providers.helpers import anthropic_http, openai_http
from providers.replay import ReplayServer
from turnwire.providers import Provider
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    """A started replay server (127.0.0.1, free port)."""
    with ReplayServer() as server:
        yield server


@pytest.fixture
async def anthropic_provider(replay: ReplayServer) -> AsyncIterator[AnthropicMessagesProvider]:
    """The Anthropic adapter on an ``AsyncAnthropic`` pointed at the replay server (no SDK retries)."""
    client = anthropic.AsyncAnthropic(
        api_key="test-key", base_url=replay.url, max_retries=0, http_client=anthropic_http()
    )
    provider = AnthropicMessagesProvider("anthropic", client, retry_delay=0.01)
    yield provider
    await provider.aclose()


@pytest.fixture
async def chat_provider(replay: ReplayServer) -> AsyncIterator[OpenAIChatProvider]:
    """The Chat Completions adapter on an ``AsyncOpenAI`` pointed at the replay server."""
    client = openai.AsyncOpenAI(
        api_key="test-key", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    provider = OpenAIChatProvider("openai", client, retry_delay=0.01)
    yield provider
    await provider.aclose()


@pytest.fixture
async def responses_provider(replay: ReplayServer) -> AsyncIterator[OpenAIResponsesProvider]:
    """The Responses adapter on an ``AsyncOpenAI`` pointed at the replay server."""
    client = openai.AsyncOpenAI(
        api_key="test-key", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    provider = OpenAIResponsesProvider("openai-responses", client, retry_delay=0.01)
    yield provider
    await provider.aclose()


@pytest.fixture
def adapters(
    anthropic_provider: AnthropicMessagesProvider,
    chat_provider: OpenAIChatProvider,
    responses_provider: OpenAIResponsesProvider,
) -> dict[str, Provider]:
    """All three adapters on the same replay server, by fixture name."""
    return {
        "anthropic_provider": anthropic_provider,
        "chat_provider": chat_provider,
        "responses_provider": responses_provider,
    }
