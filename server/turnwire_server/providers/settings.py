"""Provider entries of the configuration, and the factory that builds a provider from one.

``providers:`` in the YAML maps a name (the ``provider`` part of model ids
``provider:model``) to one entry; ``type`` picks the adapter:

============================ ==================================================
``scripted`` (the default)   the offline scripted model (``scripts``)
``anthropic``                Anthropic Messages (:mod:`.anthropic_messages`)
``openai``                   OpenAI Chat Completions, and OpenAI-compatible
                             servers through ``base_url`` (:mod:`.openai_chat`)
``openai-responses``         OpenAI Responses (:mod:`.openai_responses`)
``bedrock``                  Claude on Amazon Bedrock (:mod:`.anthropic_platforms`)
``vertex``                   Claude on Google Vertex AI (:mod:`.anthropic_platforms`)
``gemini``                   Gemini, on the Gemini API or Vertex AI (:mod:`.gemini`)
============================ ==================================================

Every SDK entry has ``base_url``,
``default_headers``, ``timeout_seconds`` (per request, and per read while
streaming), ``max_retries`` (the SDK's retry count, also the bound for retrying
an in-stream failure before the first chunk) and ``models`` (an allow-list for
admission; empty: any model); those authenticated by an API key ``api_key_env`` (the *name* of
the environment variable that holds the key; ``null`` for servers that need none), the cloud
platforms their default credential chains. :func:`build_provider` raises
:class:`ProviderConfigError` at start when the key variable is missing or empty.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from turnwire.providers import Provider
from turnwire.testing import ScriptStep, check_repeat_last
from turnwire_server.config_section import ConfigSection
from turnwire_server.providers.inline_reasoning import TAG_NAME
from turnwire_server.redaction import secret
from turnwire_server.url_check import check_http_url

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_FIELD_VALUE = re.compile(r"(?:[\x21-\x7e\x80-\xff](?:[\x20\x09\x21-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")

NO_KEY = "no-key"
"""Sent as the API key to servers configured with ``api_key_env: null`` (the SDKs require one)."""


class ScriptedProviderSettings(ConfigSection):
    """The offline scripted model. ``scripts`` maps a script name to its steps; ``record_requests``
    (a file path) appends every request the model gets as one JSON line, for tests;
    ``context_window`` (tokens) makes it refuse a request whose input is larger, as a real
    model does (Anthropic's ``prompt is too long`` error), to try context compaction offline.
    ``strict`` (for tests) fails a call past a script's last step instead of playing that step
    again, unless the step says ``repeat: true`` (see :mod:`turnwire.testing`)."""

    type: Literal["scripted"] = "scripted"
    scripts: dict[str, list[ScriptStep]] = Field(default_factory=dict)
    strict: bool = Field(
        False,
        description="fail a model call past a script's last step (unless it has repeat: true); for tests",
    )
    record_requests: str | None = Field(
        None, description="append each model request as a JSON line to this file (tests)"
    )
    context_window: int | None = Field(
        None, ge=1, description="input tokens above which a request fails with a context overflow"
    )

    @field_validator("scripts")
    @classmethod
    def _check_scripts(cls, scripts: dict[str, list[ScriptStep]]) -> dict[str, list[ScriptStep]]:
        for name, steps in scripts.items():
            if not steps:
                raise ValueError(f"script {name!r} has no steps; a script needs at least one")
            try:
                check_repeat_last(steps)
            except ValueError as error:
                raise ValueError(f"script {name!r}: {error}") from None
        return scripts


def _api_key_env(default: str | None) -> Any:
    # The variable's name is shown; its value is a secret (kept out of logs and config show).
    return Field(
        default,
        description="name of the environment variable holding the API key; null: no key needed",
        json_schema_extra=secret("env"),
    )


class _HttpProviderSettings(ConfigSection):
    """Fields every official-SDK provider has. Times in seconds."""

    base_url: str | None = Field(
        None,
        description="API base URL; the SDK's default (the vendor's API) when unset",
        json_schema_extra=secret("url"),
    )
    default_headers: dict[str, str] = Field(default_factory=dict, json_schema_extra=secret("values"))
    timeout_seconds: float = Field(600.0, gt=0)
    max_retries: int = Field(2, ge=0, le=10)
    models: list[str] = Field(default_factory=list, description="allowed model names; empty: any")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return check_http_url(value, "https://api.example.com/v1")

    @field_validator("default_headers")
    @classmethod
    def _valid_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        # RFC 9110 §5.1 (field-name = token) and §5.5 (field-value: no leading or trailing
        # whitespace, no CR/LF/NUL): httpx would refuse such a header only at the first request.
        for name, value in headers.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(
                    f"header name {name!r} is not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)"
                )
            if not _FIELD_VALUE.fullmatch(value):
                raise ValueError(
                    # The value is a secret (an Authorization header, say): never quoted back.
                    f"header {name}: its value has leading or trailing whitespace or a control "
                    "character; remove them"
                )
        return headers


class _SdkProviderSettings(_HttpProviderSettings):
    """An SDK provider authenticated by an API key from the environment."""

    api_key_env: str | None = _api_key_env(None)


class _MessagesSettings(ConfigSection):
    """Fields of every Anthropic Messages entry (``anthropic``, ``bedrock``, ``vertex``)."""

    default_max_tokens: int = Field(8192, ge=1)
    structured_output: Literal["tool", "native"] = "tool"
    prompt_caching: Literal["5m", "1h", "off"] = Field(
        "5m",
        description="cache_control breakpoints on the conversation so far, the system prompt and the "
        "tools, kept 5m or 1h (1h writes cost more); off for a server that rejects cache_control",
    )

    @field_validator("prompt_caching", mode="before")
    @classmethod
    def _caching_switch(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted on/off (yes/no) as a boolean: take it as meant.
        return ("5m" if value else "off") if isinstance(value, bool) else value


class AnthropicProviderSettings(_SdkProviderSettings, _MessagesSettings):
    """Anthropic Messages. ``default_max_tokens`` is sent when a turn sets no ``max_output_tokens``
    (the API requires one); ``structured_output`` is ``tool`` (a forced tool) or ``native``
    (``output_config.format``); ``prompt_caching`` the lifetime of the cache breakpoints the
    sidecar places, or ``off`` (docs/providers.md, "Prompt caching")."""

    type: Literal["anthropic"]
    api_key_env: str | None = _api_key_env("ANTHROPIC_API_KEY")


class BedrockProviderSettings(_HttpProviderSettings, _MessagesSettings):
    """Claude on Amazon Bedrock (``AsyncAnthropicBedrock``). Credentials come from the AWS default
    chain (environment, shared files and ``profile``, SSO, container or instance role; or a Bedrock
    API key in ``AWS_BEARER_TOKEN_BEDROCK``), never from this file. ``region``: the AWS region
    (null: ``AWS_REGION``, ``AWS_DEFAULT_REGION`` or the profile's). docs/providers.md, "bedrock"."""

    type: Literal["bedrock"]
    region: str | None = Field(None, description="AWS region, e.g. us-east-1; null: from the environment")
    profile: str | None = Field(None, description="a named profile of the AWS shared config files")


class VertexProviderSettings(_HttpProviderSettings, _MessagesSettings):
    """Claude on Google Cloud Vertex AI (``AsyncAnthropicVertex``). Credentials are Google's
    Application Default Credentials, never from this file. ``project`` (null:
    ``GOOGLE_CLOUD_PROJECT``) and ``location`` (a region such as ``us-east5``, or ``global``).
    docs/providers.md, "vertex"."""

    type: Literal["vertex"]
    project: str | None = Field(None, description="Google Cloud project id; null: GOOGLE_CLOUD_PROJECT")
    location: str = Field("global", min_length=1, description="Vertex AI location: a region or global")


class GeminiProviderSettings(_SdkProviderSettings):
    """Gemini through ``google-genai``: the Gemini Developer API with an API key (``api_key_env``,
    ``GEMINI_API_KEY`` by default), or Vertex AI (``vertex: true``) with Application Default
    Credentials, ``project`` (null: ``GOOGLE_CLOUD_PROJECT``) and ``location``. docs/providers.md,
    "gemini"."""

    type: Literal["gemini"]
    api_key_env: str | None = _api_key_env("GEMINI_API_KEY")
    vertex: bool = Field(False, description="Vertex AI with Application Default Credentials instead of a key")
    project: str | None = Field(
        None, description="with vertex: the Google Cloud project; null: GOOGLE_CLOUD_PROJECT"
    )
    location: str = Field("global", min_length=1, description="with vertex: a region, or global")
    default_max_tokens: int | None = Field(None, ge=1, description="max_output_tokens when a turn sets none")


class _CacheKeySettings(ConfigSection):
    """The field of every OpenAI entry (``openai``, ``openai-responses``) that sends each
    conversation's opaque ``prompt_cache_key`` (docs/providers.md, "Prompt caching")."""

    prompt_cache_key: Literal["auto", "on", "off"] = Field(
        "auto",
        description="send each conversation's opaque prompt_cache_key: auto (to OpenAI's own API "
        "only), on, off",
    )

    @field_validator("prompt_cache_key", mode="before")
    @classmethod
    def _cache_key_switch(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted on/off (yes/no) as a boolean: take it as meant.
        return ("on" if value else "off") if isinstance(value, bool) else value


class OpenAIProviderSettings(_SdkProviderSettings, _CacheKeySettings):
    """OpenAI Chat Completions or an OpenAI-compatible server (vLLM, Ollama, llama.cpp, LiteLLM,
    OpenRouter) at ``base_url``. ``max_tokens_param``: ``auto`` sends ``max_completion_tokens`` to
    OpenAI and ``max_tokens`` to other servers. ``include_usage`` asks for the final usage chunk.
    ``replay_reasoning``: which assistant messages carry their reasoning back as
    ``reasoning_content`` (``auto``: a tool turn's, for DeepSeek and Kimi K2 thinking models).
    ``inline_reasoning_tag`` (off by default): a tag name such as ``think`` whose ``<think>…</think>``
    in the text is reasoning; ``inline_reasoning_starts_inside`` when the output begins inside it.
    ``prompt_cache_key``: send each conversation's opaque key (``auto``: to OpenAI only).
    docs/providers.md, "openai"."""

    type: Literal["openai"]
    api_key_env: str | None = _api_key_env("OPENAI_API_KEY")
    max_tokens_param: Literal["auto", "max_completion_tokens", "max_tokens"] = "auto"
    include_usage: bool = True
    replay_reasoning: Literal["auto", "tool_turns", "always", "never"] = Field(
        "auto",
        description="assistant messages that carry their reasoning back as reasoning_content: "
        "auto (a tool turn's, for DeepSeek and Kimi K2 thinking models), tool_turns, always, never",
    )
    inline_reasoning_tag: str | None = Field(
        None,
        description="read <TAG>…</TAG> in the answer text as reasoning (e.g. think); null: off",
    )
    inline_reasoning_starts_inside: bool = Field(
        False,
        description="with inline_reasoning_tag: the output begins inside the reasoning (the chat "
        "template opened the tag in the prompt, as DeepSeek-R1's and QwQ's do)",
    )

    @field_validator("inline_reasoning_tag")
    @classmethod
    def _tag_name(cls, value: str | None) -> str | None:
        if value is not None and not TAG_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a tag name: give the name without brackets, e.g. think "
                "(letters, digits, _.:-, starting with a letter)"
            )
        return value


class OpenAIResponsesProviderSettings(_SdkProviderSettings, _CacheKeySettings):
    """OpenAI Responses. ``store`` false (the default) keeps nothing at OpenAI and round-trips reasoning
    as encrypted content; ``encrypted_reasoning`` says when to request it (``auto``: reasoning models).
    ``replay_reasoning``: which reasoning that has neither encrypted content nor an item stored at
    OpenAI goes back as text (``auto``: a tool turn's, for DeepSeek and Kimi K2 thinking models).
    ``prompt_cache_key``: send each conversation's opaque key (``auto``: to OpenAI only).
    docs/providers.md, "openai-responses"."""

    type: Literal["openai-responses"]
    api_key_env: str | None = _api_key_env("OPENAI_API_KEY")
    store: bool = False
    encrypted_reasoning: Literal["auto", "always", "never"] = "auto"
    replay_reasoning: Literal["auto", "tool_turns", "always", "never"] = Field(
        "auto",
        description="reasoning items without encrypted content sent back as text: auto (a tool "
        "turn's, for DeepSeek and Kimi K2 thinking models), tool_turns, always, never",
    )


def _entry_type(value: Any) -> str | None:
    """The entry's tag. No ``type:`` means ``scripted`` only when every key is a scripted field:
    an entry with ``base_url`` or ``api_key_env`` but no ``type`` is a mistake to report
    (None: pydantic's ``union_tag_not_found``), not a scripted model to start."""
    if not isinstance(value, Mapping):
        return str(getattr(value, "type", "scripted"))
    if "type" in value:
        return str(value["type"])
    return "scripted" if set(value) <= set(ScriptedProviderSettings.model_fields) else None


ProviderSettings = Annotated[
    Annotated[ScriptedProviderSettings, Tag("scripted")]
    | Annotated[AnthropicProviderSettings, Tag("anthropic")]
    | Annotated[OpenAIProviderSettings, Tag("openai")]
    | Annotated[OpenAIResponsesProviderSettings, Tag("openai-responses")]
    | Annotated[BedrockProviderSettings, Tag("bedrock")]
    | Annotated[VertexProviderSettings, Tag("vertex")]
    | Annotated[GeminiProviderSettings, Tag("gemini")],
    Discriminator(_entry_type),
]
"""One ``providers:`` entry; ``type`` defaults to ``scripted``."""


class ProviderConfigError(ValueError):
    """A provider entry cannot be used (for example its API key variable is not set)."""


def _api_key(name: str, settings: _SdkProviderSettings, environ: Mapping[str, str]) -> str:
    if settings.api_key_env is None:
        return NO_KEY
    key = environ.get(settings.api_key_env, "")
    if not key:
        # The null advice only fits a server of your own (a base_url): the vendor's API needs a key.
        fix = (
            "set it, or set api_key_env to null if the server at base_url needs no key"
            if settings.base_url
            else "set it (the vendor's API needs a key)"
        )
        raise ProviderConfigError(
            f"provider {name!r}: environment variable {settings.api_key_env} (its api_key_env) "
            f"is not set; {fix}"
        )
    return key


def build_provider(
    name: str, settings: ProviderSettings, environ: Mapping[str, str] | None = None
) -> Provider:
    """The provider for one config entry. Raises :class:`ProviderConfigError` when its key is missing.

    The SDKs are imported only for the types configured.
    """
    env = os.environ if environ is None else environ
    if isinstance(settings, ScriptedProviderSettings):
        from turnwire.testing import ScriptedProvider

        return ScriptedProvider(
            settings.scripts,
            record_path=settings.record_requests,
            context_window=settings.context_window,
            strict=settings.strict,
        )
    if isinstance(settings, BedrockProviderSettings | VertexProviderSettings):
        return _platform_provider(name, settings, env)
    if isinstance(settings, GeminiProviderSettings):
        return _gemini_provider(name, settings, env)
    key = _api_key(name, settings, env)
    common: dict[str, Any] = {
        "api_key": key,
        "base_url": settings.base_url,
        "timeout": settings.timeout_seconds,
        "max_retries": settings.max_retries,
        "default_headers": settings.default_headers or None,
    }
    if isinstance(settings, AnthropicProviderSettings):
        import anthropic

        from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider

        return AnthropicMessagesProvider(
            name,
            anthropic.AsyncAnthropic(**common, http_client=_http_client(anthropic, name)),
            models=settings.models,
            default_max_tokens=settings.default_max_tokens,
            structured_output=settings.structured_output,
            prompt_caching=None if settings.prompt_caching == "off" else settings.prompt_caching,
        )
    import openai

    if isinstance(settings, OpenAIProviderSettings):
        from turnwire_server.providers.openai_chat import OpenAIChatProvider

        param = settings.max_tokens_param
        if param == "auto":
            param = "max_completion_tokens" if _is_openai(settings) else "max_tokens"
        return OpenAIChatProvider(
            name,
            openai.AsyncOpenAI(**common, http_client=_http_client(openai, name)),
            models=settings.models,
            max_tokens_param=param,
            include_usage=settings.include_usage,
            replay_reasoning=settings.replay_reasoning,
            inline_reasoning_tag=settings.inline_reasoning_tag,
            inline_reasoning_starts_inside=settings.inline_reasoning_starts_inside,
            prompt_cache_key=_cache_key_on(settings),
        )
    from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

    return OpenAIResponsesProvider(
        name,
        openai.AsyncOpenAI(**common, http_client=_http_client(openai, name)),
        models=settings.models,
        store=settings.store,
        encrypted_reasoning=settings.encrypted_reasoning,
        replay_reasoning=settings.replay_reasoning,
        prompt_cache_key=_cache_key_on(settings),
    )


def _platform_provider(
    name: str, settings: BedrockProviderSettings | VertexProviderSettings, env: Mapping[str, str]
) -> Provider:
    """Claude on Bedrock or Vertex AI through the ``anthropic`` SDK's platform client; credentials
    are the platform's default chain, looked up at the first request (not at start: an instance
    role or the metadata server answers only there). Raises :class:`ProviderConfigError` when the
    region (Bedrock) or project (Vertex AI) is nowhere, or the SDK extra is not installed."""
    extra = "bedrock" if isinstance(settings, BedrockProviderSettings) else "vertex"
    try:
        import anthropic

        from turnwire_server.providers import anthropic_platforms

        if extra == "bedrock":
            import boto3  # noqa: F401  (the SDK imports it only at the first request)
        else:
            import google.auth  # noqa: F401
    except ImportError as error:
        raise ProviderConfigError(
            f"provider {name!r}: type {extra} needs the {extra} extra: pip install 'turnwire[{extra}]' "
            f"({error.name} is not installed)"
        ) from None
    common: dict[str, Any] = {
        "base_url": settings.base_url,
        "timeout": settings.timeout_seconds,
        "max_retries": settings.max_retries,
        "default_headers": settings.default_headers or None,
        "http_client": _http_client(anthropic, name),
    }
    options = {
        "models": settings.models,
        "default_max_tokens": settings.default_max_tokens,
        "structured_output": settings.structured_output,
        "prompt_caching": None if settings.prompt_caching == "off" else settings.prompt_caching,
    }
    if isinstance(settings, BedrockProviderSettings):
        from botocore.exceptions import BotoCoreError

        if env.get("AWS_BEARER_TOKEN_BEDROCK") == "":
            # The SDK would send it as an empty bearer token, which no request survives.
            raise ProviderConfigError(
                f"provider {name!r}: AWS_BEARER_TOKEN_BEDROCK is set but empty; unset it to use the "
                "AWS credential chain, or set it to a Bedrock API key"
            )

        try:
            client = anthropic.AsyncAnthropicBedrock(
                aws_region=settings.region, aws_profile=settings.profile, **common
            )
        except (ValueError, BotoCoreError) as error:  # no region anywhere; a profile not in the files
            raise ProviderConfigError(f"provider {name!r}: {error}; set region in its entry") from None
        return anthropic_platforms.BedrockMessagesProvider(name, client, **options)
    project = settings.project or env.get("GOOGLE_CLOUD_PROJECT") or env.get("ANTHROPIC_VERTEX_PROJECT_ID")
    if not project:
        raise ProviderConfigError(
            f"provider {name!r}: no Google Cloud project: set project in its entry or GOOGLE_CLOUD_PROJECT"
        )
    vertex = anthropic.AsyncAnthropicVertex(region=settings.location, project_id=project, **common)
    return anthropic_platforms.VertexMessagesProvider(name, vertex, **options)


def _gemini_provider(name: str, settings: GeminiProviderSettings, env: Mapping[str, str]) -> Provider:
    """Gemini through ``google-genai``: with an API key from ``api_key_env``, or on Vertex AI with
    Application Default Credentials (looked up by the SDK). Raises :class:`ProviderConfigError`
    when the key variable or the project is missing, or the ``gemini`` extra is not installed."""
    try:
        from google import genai
        from google.genai import types

        from turnwire_server.providers.gemini import GeminiProvider, async_http_client
    except ImportError as error:
        raise ProviderConfigError(
            f"provider {name!r}: type gemini needs the gemini extra: pip install 'turnwire[gemini]' "
            f"({error.name} is not installed)"
        ) from None
    http_options = types.HttpOptions(
        base_url=settings.base_url,
        headers=settings.default_headers or None,
        timeout=int(settings.timeout_seconds * 1000),  # milliseconds
        retry_options=types.HttpRetryOptions(attempts=settings.max_retries + 1),
        httpx_async_client=async_http_client(),
    )
    if settings.vertex:
        project = settings.project or env.get("GOOGLE_CLOUD_PROJECT")
        if not project:
            raise ProviderConfigError(
                f"provider {name!r}: vertex: true needs a Google Cloud project: set project in its entry "
                "or GOOGLE_CLOUD_PROJECT"
            )
        client = genai.Client(
            vertexai=True, project=project, location=settings.location, http_options=http_options
        )
    else:
        client = genai.Client(api_key=_api_key(name, settings, env), http_options=http_options)
    return GeminiProvider(
        name,
        client,
        models=settings.models,
        max_retries=settings.max_retries,
        timeout_seconds=settings.timeout_seconds,
        default_max_tokens=settings.default_max_tokens,
    )


def _is_openai(settings: _SdkProviderSettings) -> bool:
    """Whether the entry reaches OpenAI's own API (no ``base_url``, or api.openai.com)."""
    return settings.base_url is None or "api.openai.com" in settings.base_url


def _cache_key_on(settings: OpenAIProviderSettings | OpenAIResponsesProviderSettings) -> bool:
    """``prompt_cache_key``: ``auto`` sends it to OpenAI's own API only (a compatible server may
    refuse a field it does not know)."""
    return settings.prompt_cache_key == "on" or (settings.prompt_cache_key == "auto" and _is_openai(settings))


def _http_client(sdk: Any, name: str) -> Any:
    """The SDK's own aiohttp-backed HTTP client (``DefaultAioHttpClient``: the SDK's defaults for
    connection limits, keep-alive and timeouts, proxies from the environment) with the event hooks
    of provider ``name``: its retries counted (providers/metrics.py). aiohttp rather than the
    default httpx2/h11 stack: it parses a streamed response in C and costs about half the CPU per
    event (bench/ttft.md, "Issue 33: the SDKs' aiohttp transport")."""
    from turnwire_server.providers.metrics import count_sdk_retries

    return sdk.DefaultAioHttpClient(event_hooks={"request": [count_sdk_retries(name)]})


def default_providers() -> dict[str, ProviderSettings]:
    """The ``providers:`` default: only the offline scripted model, named ``scripted``."""
    return {"scripted": ScriptedProviderSettings()}


PROVIDER_TYPES = frozenset(
    {"scripted", "anthropic", "openai", "openai-responses", "bedrock", "vertex", "gemini"}
)


def entry_location(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """A validation error location without the union tag pydantic inserts after ``providers.<name>``
    (``providers.claude.anthropic.base_url`` → ``providers.claude.base_url``)."""
    if len(loc) > 2 and loc[0] == "providers" and loc[2] in PROVIDER_TYPES:
        return (*loc[:2], *loc[3:])
    return loc
