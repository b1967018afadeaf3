"""Provider adapters (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses) and model-id resolution.

The interface the adapters implement is public, in :mod:`turnwire.providers`;
each adapter is its own module here, loaded only when configured
(:mod:`turnwire_server.providers.settings`). The engine sees only
:class:`~turnwire_server.providers.registry.ProviderRegistry`.
"""
