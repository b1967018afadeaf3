"""Provider config entries (``turnwire_server.providers.settings``) and the factory, via the replay server."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from providers.helpers import a_text_stream, c_chunk, chat_sse, collect, request
from providers.replay import ReplayServer, Reply
from turnwire.testing import ScriptedProvider
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider
from turnwire_server.providers.settings import ProviderConfigError, ProviderSettings, build_provider

ENTRIES = TypeAdapter(dict[str, ProviderSettings])


def test_entries_parse_by_type_and_scripted_is_the_default() -> None:
    parsed = ENTRIES.validate_python(
        {
            "scripted": {"scripts": {}},
            "claude": {"type": "anthropic", "models": ["claude-sonnet-4-5"], "default_max_tokens": 1024},
            "local": {"type": "openai", "base_url": "http://127.0.0.1:11434/v1", "api_key_env": None},
            "gpt": {"type": "openai-responses", "timeout_seconds": 30, "max_retries": 0},
        }
    )
    assert [entry.type for entry in parsed.values()] == [
        "scripted",
        "anthropic",
        "openai",
        "openai-responses",
    ]


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "anthropic", "api_key": "sk-inline"},  # keys never inline: only the variable's name
        {"type": "openai", "max_retries": -1},
        {"type": "openai-responses", "timeout_seconds": 0},
        {"type": "openai-responses", "replay_reasoning": "sometimes"},
        {"type": "cohere"},  # no such type
        {"type": "bedrock", "aws_secret_access_key": "inline"},  # cloud credentials never in the file
        {"type": "vertex", "api_key_env": "GOOGLE_KEY"},  # Application Default Credentials only
        {"type": "gemini", "vertex": True, "location": ""},
        {"scripts": {}, "base_url": "http://x"},
    ],
)
def test_invalid_entries_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ENTRIES.validate_python({"p": entry})


async def test_replay_reasoning_reaches_the_responses_provider() -> None:
    entries = ENTRIES.validate_python(
        {"d": {"type": "openai-responses", "replay_reasoning": "always"}, "o": {"type": "openai-responses"}}
    )
    built = [build_provider(name, entry, environ={"OPENAI_API_KEY": "k"}) for name, entry in entries.items()]
    try:
        assert [getattr(provider, "replay_reasoning", None) for provider in built] == ["always", "auto"]
    finally:
        for provider in built:
            await provider.aclose()


def test_missing_key_variable_is_a_clear_error() -> None:
    entry = ENTRIES.validate_python({"claude": {"type": "anthropic", "api_key_env": "MY_CLAUDE_KEY"}})[
        "claude"
    ]
    with pytest.raises(ProviderConfigError, match="MY_CLAUDE_KEY"):
        build_provider("claude", entry, environ={})


async def test_built_providers_talk_through_the_sdks(replay: ReplayServer) -> None:
    entries = ENTRIES.validate_python(
        {
            "claude": {
                "type": "anthropic",
                "base_url": replay.url,
                "api_key_env": "K",
                "max_retries": 0,
                "default_headers": {"x-team": "a"},
                "models": ["claude-x"],
            },
            "local": {"type": "openai", "base_url": f"{replay.url}/v1", "api_key_env": None},
            "gpt": {"type": "openai-responses", "base_url": f"{replay.url}/v1", "api_key_env": "K"},
            "scripted": {},
        }
    )
    providers = {
        name: build_provider(name, entry, environ={"K": "sk-test"}) for name, entry in entries.items()
    }
    assert isinstance(providers["claude"], AnthropicMessagesProvider)
    assert isinstance(providers["local"], OpenAIChatProvider)
    assert isinstance(providers["gpt"], OpenAIResponsesProvider)
    assert isinstance(providers["scripted"], ScriptedProvider)
    assert providers["claude"].has_model("claude-x") and not providers["claude"].has_model("claude-y")
    assert providers["local"].has_model("anything")
    replay.enqueue(
        Reply.sse(a_text_stream("A")), Reply.sse(chat_sse(c_chunk({"content": "B"}), c_chunk({}, "stop")))
    )
    claude = await collect(providers["claude"], request(model="claude-x"))
    local = await collect(providers["local"], request(model="qwen3", settings=_limit(10)))
    for provider in providers.values():
        await provider.aclose()
    assert (claude.text, local.text) == ("A", "B")
    first, second = replay.requests
    assert first.headers["authorization"] == "Bearer sk-test" and first.headers["x-team"] == "a"
    assert second.headers["authorization"] == "Bearer no-key"
    assert second.json["max_tokens"] == 10  # "auto": a compatible server gets max_tokens


def _limit(tokens: int) -> Any:
    from turnwire.types import ModelSettings

    return ModelSettings(max_output_tokens=tokens)


def test_config_errors_name_the_field_without_the_union_tag(tmp_path: Any) -> None:
    from turnwire_server.config import ConfigError, load_settings

    path = tmp_path / "c.yaml"
    path.write_text("providers:\n  claude:\n    type: anthropic\n    max_retries: -1\n")
    with pytest.raises(ConfigError, match=r"providers\.claude\.max_retries: Input should be greater"):
        load_settings(path)


def test_an_environment_list_that_is_not_json_says_how_to_write_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from turnwire_server.config import ConfigError, load_settings

    monkeypatch.setenv("TURNWIRE_TOOLS__REQUIRE_APPROVAL", "get_current_time")
    with pytest.raises(ConfigError, match=r"TURNWIRE_\* variable is JSON"):
        load_settings(None)
    monkeypatch.setenv("TURNWIRE_TOOLS__REQUIRE_APPROVAL", '["get_current_time"]')
    assert load_settings(None).tools.require_approval == ["get_current_time"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"base_url": "http://127.0.0.1:1/v1"}, "providers.openai: no `type:` given; add `type: openai`"),
        ({"type": "antropic"}, "providers.openai: unknown type 'antropic'; did you mean 'anthropic'?"),
        (
            {"type": "openai", "default_headers": {"X-Team": "a "}},
            "providers.openai.default_headers: header X-Team: its value has leading or trailing whitespace",
        ),
        (
            {"type": "openai", "base_url": "localhost:8000/v1"},
            "providers.openai.base_url: 'localhost:8000/v1' is not an http(s) URL with a host",
        ),
    ],
)
def test_a_bad_provider_entry_says_what_to_fix(tmp_path: Any, entry: dict[str, Any], message: str) -> None:
    import yaml

    from turnwire_server.config import ConfigError, load_settings

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"providers": {"openai": entry}}))
    with pytest.raises(ConfigError) as raised:
        load_settings(path)
    assert message in str(raised.value)
    assert "_entry_type" not in str(raised.value) and "Value error" not in str(raised.value)


def test_an_entry_with_only_scripted_fields_needs_no_type() -> None:
    parsed = ENTRIES.validate_python({"offline": {"scripts": {}, "context_window": 100}})
    assert parsed["offline"].type == "scripted"


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_unreachable_upstream_names_its_endpoint(kind: str) -> None:
    from support.sidecar import free_port

    from turnwire.providers import ProviderError

    port = free_port()  # nothing listens there
    base = f"http://127.0.0.1:{port}" + ("/v1" if kind == "openai" else "")
    entry = ENTRIES.validate_python(
        {"p": {"type": kind, "base_url": base, "api_key_env": None, "max_retries": 0}}
    )
    provider = build_provider("p", entry["p"], environ={})
    result = await collect(provider, request(settings=_limit(5)))
    await provider.aclose()
    assert isinstance(result.error, ProviderError)
    path = "/v1/chat/completions" if kind == "openai" else "/v1/messages"
    assert f"p: connection error (POST http://127.0.0.1:{port}{path}):" in str(result.error)


@pytest.mark.parametrize("kind", ["openai", "anthropic", "openai-responses"])
async def test_a_404_from_the_upstream_names_the_url_called(kind: str) -> None:
    """A base_url without its /v1 answers 404 from most OpenAI-compatible servers (Ollama: "404
    page not found"); only the URL called shows the missing part, so the error names it."""
    import http.server
    import threading

    from turnwire.providers import ProviderError

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b"404 page not found"
            self.send_response(404)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        entry = ENTRIES.validate_python(
            {"p": {"type": kind, "base_url": base, "api_key_env": None, "max_retries": 0}}
        )
        provider = build_provider("p", entry["p"], environ={})
        result = await collect(provider, request(settings=_limit(5)))
        await provider.aclose()
    finally:
        server.shutdown()
        server.server_close()
    assert isinstance(result.error, ProviderError)
    path = {"openai": "/chat/completions", "anthropic": "/v1/messages", "openai-responses": "/responses"}[
        kind
    ]
    assert f"p: HTTP 404 (POST {base}{path}; check base_url): 404 page not found" in str(result.error)


def test_unquoted_on_and_off_in_yaml_mean_what_they_say() -> None:
    """YAML 1.1 reads an unquoted ``on``/``off`` as a boolean; the caching switches take it as the
    word the user wrote (docs/providers.md, "Prompt caching")."""
    import yaml

    entries = yaml.safe_load(
        "a: {type: anthropic, prompt_caching: off}\n"
        "b: {type: openai, prompt_cache_key: on}\n"
        "c: {type: openai-responses, prompt_cache_key: off}\n"
        "d: {type: anthropic, prompt_caching: on}\n"
    )
    parsed = ENTRIES.validate_python(entries)
    assert [getattr(parsed[n], f) for n, f in (("a", "prompt_caching"), ("b", "prompt_cache_key"))] == [
        "off",
        "on",
    ]
    assert parsed["c"].prompt_cache_key == "off"  # type: ignore[union-attr]
    assert parsed["d"].prompt_caching == "5m"  # type: ignore[union-attr]
