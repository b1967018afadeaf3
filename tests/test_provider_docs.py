"""The provider guide (``docs/providers.md``) cannot rot.

Every ```yaml block in it is a complete config file: it must load with
``turnwire_server.config.load_settings`` and its providers must build with
``turnwire_server.assembly.build_providers`` (the named API key variables set to dummy values),
and its ``default_model`` must resolve. The field tables must list every field of
every entry type with its real default, and the guide must keep a working example
for each provider type and for a local OpenAI-compatible server.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from turnwire.testing import ScriptedProvider
from turnwire_server.assembly import build_providers
from turnwire_server.config import Settings, load_settings
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.anthropic_platforms import BedrockMessagesProvider, VertexMessagesProvider
from turnwire_server.providers.gemini import GeminiProvider
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider
from turnwire_server.providers.settings import (
    AnthropicProviderSettings,
    BedrockProviderSettings,
    GeminiProviderSettings,
    OpenAIProviderSettings,
    OpenAIResponsesProviderSettings,
    ScriptedProviderSettings,
    VertexProviderSettings,
)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "providers.md"
TEXT = GUIDE.read_text()
YAML_BLOCKS = re.findall(r"^```yaml\n(.*?)^```", TEXT, flags=re.MULTILINE | re.DOTALL)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TURNWIRE_* variable of the host may change what a block means."""
    for name in list(os.environ):
        if name.startswith("TURNWIRE_"):
            monkeypatch.delenv(name)


def load(block: str, tmp_path: Path) -> Settings:
    path = tmp_path / "turnwire.yaml"
    path.write_text(block)
    return load_settings(path)


def key_variables(settings: Settings) -> Iterator[str]:
    for entry in settings.providers.values():
        name = getattr(entry, "api_key_env", None)
        if name is not None:
            yield name


def test_the_guide_has_yaml_examples() -> None:
    assert len(YAML_BLOCKS) >= 4, YAML_BLOCKS


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[f"yaml{i + 1}" for i in range(len(YAML_BLOCKS))])
async def test_each_yaml_example_loads_and_builds(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load(block, tmp_path)
    for name in key_variables(settings):
        monkeypatch.setenv(name, f"dummy-{name.lower()}")
    registry = build_providers(settings)
    try:
        assert set(registry.providers) == set(settings.providers)
        provider, model = registry.resolve(settings.default_model)
        assert model == settings.default_model.split(":", 1)[1]
        assert provider is registry.providers[settings.default_model.split(":", 1)[0]]
    finally:
        await registry.aclose()


def _built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Settings, dict[str, Any]]]:
    """Every example with its built providers (closed again at once: only their settings matter here)."""
    out = []
    for index, block in enumerate(YAML_BLOCKS):
        folder = tmp_path / str(index)
        folder.mkdir()
        settings = load(block, folder)
        for name in key_variables(settings):
            monkeypatch.setenv(name, "dummy")
        out.append((settings, build_providers(settings).providers))
    return out


async def test_there_is_an_example_for_each_provider_type_and_a_local_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _built(tmp_path, monkeypatch)
    try:
        defaults = {type(providers[s.default_model.split(":", 1)[0]]) for s, providers in built}
        assert {
            AnthropicMessagesProvider,
            OpenAIChatProvider,
            OpenAIResponsesProvider,
            BedrockMessagesProvider,
            VertexMessagesProvider,
            GeminiProvider,
        } <= defaults
        local = [
            (settings.providers[name], provider)
            for settings, providers in built
            for name, provider in providers.items()
            if isinstance(provider, OpenAIChatProvider)
            and str(provider.client.base_url).startswith("http://127.0.0.1:11434/v1")
        ]
        assert local, "an Ollama example: type openai, base_url http://127.0.0.1:11434/v1"
        entry, provider = local[0]
        assert isinstance(entry, OpenAIProviderSettings)
        assert entry.api_key_env is None, "Ollama takes no key: api_key_env null"
        assert provider.max_tokens_param == "max_tokens", "auto picks max_tokens for a compatible server"
        assert any(isinstance(p, ScriptedProvider) for _, providers in built for p in providers.values())
    finally:
        for _, providers in built:
            for provider in providers.values():
                await provider.aclose()


def test_the_text_before_a_keyless_example_agrees_with_it() -> None:
    """The paragraph that introduces a YAML example with ``api_key_env: null`` says null too, never
    that a variable must be named (a fresh-user trial found the Ollama text and YAML at odds)."""
    for match in re.finditer(r"^```yaml\n(.*?)^```", TEXT, flags=re.MULTILINE | re.DOTALL):
        if "api_key_env: null" not in match.group(1):
            continue
        paragraph = TEXT[: match.start()].rstrip().rpartition("\n\n")[2]
        if "key" in paragraph:
            assert "`api_key_env: null`" in paragraph, paragraph
            assert "names a variable" not in paragraph, paragraph


def _rendered(value: Any) -> str:
    """A default as the tables show it (YAML spelling)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | dict) and not value:
        return "[]" if isinstance(value, list) else "{}"
    return str(value)


def _table_rows() -> dict[str, list[str]]:
    """``field`` → the default cells of every table row naming it."""
    rows: dict[str, list[str]] = {}
    for match in re.finditer(r"^\| `([a-z_]+)` \| ([^|]*) \|", TEXT, flags=re.MULTILINE):
        rows.setdefault(match.group(1), []).append(match.group(2))
    return rows


@pytest.mark.parametrize(
    "model",
    [
        ScriptedProviderSettings,
        AnthropicProviderSettings,
        OpenAIProviderSettings,
        OpenAIResponsesProviderSettings,
        BedrockProviderSettings,
        VertexProviderSettings,
        GeminiProviderSettings,
    ],
)
def test_the_field_tables_list_every_field_with_its_default(model: type[BaseModel]) -> None:
    rows = _table_rows()
    for name, info in model.model_fields.items():
        if name == "type":
            continue
        assert name in rows, f"{model.__name__}.{name} is not in a field table of {GUIDE.name}"
        default = info.get_default(call_default_factory=True)
        cell = f"`{_rendered(default)}`"
        assert any(cell in row for row in rows[name]), f"{name}: default {cell} not in {rows[name]}"
