"""The base of every configuration section and entry (:mod:`turnwire_server.config` assembles them).

Each component declares the section it reads beside itself (the engine's in
``engine/settings.py``, the tools' in ``tools/settings.py``, the providers' in
``providers/settings.py``, ``auth:`` and ``rate_limits:`` in ``access_settings.py``) and is
handed that validated section, so no setting is copied field by field on its way in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigSection(BaseModel):
    """A section (or an entry of one) of the configuration: an unknown key is an error, named
    with a close match by :mod:`turnwire_server.config_hints`."""

    model_config = ConfigDict(extra="forbid")
