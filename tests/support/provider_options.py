"""A test-only middleware that gives a turn ``provider_options`` from the request's ``body``, loaded by
a real server process as ``support.provider_options:ProviderOptionsFromBody`` (``PYTHONPATH`` from
``support.hooks.pythonpath_env``)."""

from __future__ import annotations

from turnwire.hooks import Middleware, TurnConfig, TurnContext
from turnwire.types import ModelSettings


class ProviderOptionsFromBody(Middleware):
    """``before_turn``: ``model_settings.provider_options = body["provider_options"]`` when given
    (e.g. ``{"anthropic": {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}}``)."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """The options as a TurnConfig, or None when the body has none."""
        options = ctx.body.get("provider_options")
        if not isinstance(options, dict):
            return None
        return TurnConfig(model_settings=ModelSettings(provider_options=options))
