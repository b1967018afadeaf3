"""Secrets in the configuration: which fields hold them, and keeping them out of output.

A settings field is marked secret where it is declared, with pydantic's ``SecretStr`` or with
``json_schema_extra=secret(kind)``; the kinds say where the secret sits in the field's value:

============ =====================================================================================
``value``    the whole value (a string)
``values``   every value of a mapping (HTTP headers, an environment given to a child process)
``url``      the password of a URL's user info (``scheme://user:password@host``)
``env``      the value holds the *name* of an environment variable whose value is the secret
             (``api_key_env``, ``password_env``); the name itself is shown
``keys``     a free-form mapping (a middleware's ``options``): values under keys that look like
             secrets (:data:`SECRET_KEY`), at any depth; the one place names are guessed, since
             nothing declares those fields
============ =====================================================================================

Two readers use the marks: :func:`redacted_settings` (``turnwire config show``) replaces each
secret with :data:`MASK`, and :func:`secret_values` collects the secrets' actual values for
:class:`Redactor`, which also masks what looks like a credential whatever its origin
(``Authorization`` headers, bearer tokens, URL passwords, ``api_key=…`` pairs, provider key
shapes). One redactor per process (:func:`redactor_for`) masks the text that enters from outside
where it enters: provider errors and tool errors (the engine's ``EngineSettings.redact``), so the
client's ``TurnEnd.error``, the stored turn, spans and logs all get the masked text; the log
filter applies it again to every line (docs/security.md, "Secrets").

A configured value is masked only as a whole token (not next to a letter, digit, ``_`` or ``-``)
and only from :data:`MIN_SECRET_CHARS` characters on, so a key ``mock`` never turns the provider
name ``mock-openai`` into ``***-openai``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, SecretStr

from turnwire_server.store.postgres_url import redact_url

MASK = "***"
"""What a secret is replaced with."""

SecretKind = Literal["value", "values", "url", "env", "keys"]

_MARK = "turnwire_secret"

MIN_SECRET_CHARS = 8
"""Configured values shorter than this are not searched for (a short value is an ordinary word
more often than a secret: ``mock``, ``test``); the credential patterns and key shapes of
:class:`Redactor` still apply. Real API keys are 40 characters and more."""

SECRET_KEY = re.compile(
    r"(^|_)(api_?key|key|token|secret|password|passwd|pwd|credentials?|authorization|auth)$"
)
"""Option names (after :func:`_words`: ``authToken`` → ``auth_token``) whose values are treated as
secrets in ``keys`` fields (``api_key``, ``apiKey``, ``auth-token``, ``client_secret``,
``password`` …)."""


def _looks_secret(key: object) -> bool:
    return SECRET_KEY.search(_words(str(key))) is not None


def _words(name: str) -> str:
    """``name`` in lower snake case: camelCase humps, ``-`` and ``.`` become ``_``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).replace("-", "_").replace(".", "_").lower()


_ENV_ALWAYS = ("PGPASSWORD",)
"""Environment variables read as secrets whatever the configuration says (libpq's password)."""


def secret(kind: SecretKind = "value") -> dict[str, Any]:
    """The ``json_schema_extra`` that marks a settings field as holding a secret of ``kind``."""
    return {_MARK: kind}


def _kind(model: BaseModel, name: str) -> SecretKind | None:
    extra = type(model).model_fields[name].json_schema_extra
    if isinstance(extra, dict):
        kind = extra.get(_MARK)
        if kind in ("value", "values", "url", "env", "keys"):
            return kind  # type: ignore[return-value]  # checked just above
    return None


# --- config show ----------------------------------------------------------------------------


def redacted_settings(settings: BaseModel) -> dict[str, Any]:
    """``settings`` as JSON-compatible data (``model_dump(mode="json")``) with every secret
    replaced by :data:`MASK` (see the module docstring for what counts)."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    _redact_model(settings, data)
    return data


def _redact_model(model: BaseModel, data: dict[str, Any]) -> None:
    for name in type(model).model_fields:
        if name not in data:
            continue
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            data[name] = MASK
            continue
        kind = _kind(model, name)
        if kind is not None:
            data[name] = _redact_value(kind, data[name])
        else:
            _redact_nested(value, data[name])


def _redact_nested(value: Any, data: Any) -> None:
    if isinstance(value, BaseModel) and isinstance(data, dict):
        _redact_model(value, data)
    elif isinstance(value, list | tuple) and isinstance(data, list):
        for item, item_data in zip(value, data, strict=False):
            _redact_nested(item, item_data)
    elif isinstance(value, Mapping) and isinstance(data, dict):
        for key, item in value.items():
            if key in data:
                _redact_nested(item, data[key])


def _redact_value(kind: SecretKind, data: Any) -> Any:
    if data is None:
        return None
    if kind == "value":
        return MASK
    if kind == "values":
        return {key: MASK for key in data} if isinstance(data, dict) else MASK
    if kind == "url":
        return redact_url(data) if isinstance(data, str) else MASK
    if kind == "keys":
        return _redact_keys(data)
    return data  # env: the variable's name is no secret


def _redact_keys(data: Any) -> Any:
    if isinstance(data, dict):
        return {
            key: MASK if _looks_secret(key) and data[key] is not None else _redact_keys(data[key])
            for key in data
        }
    if isinstance(data, list):
        return [_redact_keys(item) for item in data]
    return data


def url_password(url: str) -> str | None:
    """The password in ``url``'s user info, percent-decoded as a client sends it; None without one."""
    try:
        password = urlsplit(url).password
    except ValueError:  # a malformed URL: the log patterns still mask its user info
        return None
    return unquote(password) if password else None


# --- the secrets' values, for the log filter --------------------------------------------------


def secret_values(settings: BaseModel, environ: Mapping[str, str] | None = None) -> set[str]:
    """The values of every secret ``settings`` holds or names (``env`` fields are looked up in
    ``environ``, default ``os.environ``), plus ``PGPASSWORD``; empty strings left out."""
    env = os.environ if environ is None else environ
    found = set(_model_secrets(settings, env))
    found.update(env.get(name, "") for name in _ENV_ALWAYS)
    found.discard("")
    return found


def _model_secrets(model: BaseModel, env: Mapping[str, str]) -> Iterator[str]:
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            yield value.get_secret_value()
            continue
        kind = _kind(model, name)
        if kind is None:
            yield from _nested_secrets(value, env)
        elif value is not None:
            yield from _kind_secrets(kind, value, env)


def _nested_secrets(value: Any, env: Mapping[str, str]) -> Iterator[str]:
    if isinstance(value, SecretStr):  # inside a container: tracing.headers is dict[str, SecretStr]
        yield value.get_secret_value()
    elif isinstance(value, BaseModel):
        yield from _model_secrets(value, env)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _nested_secrets(item, env)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _nested_secrets(item, env)


def _kind_secrets(kind: SecretKind, value: Any, env: Mapping[str, str]) -> Iterator[str]:
    if kind == "value":
        yield str(value)
    elif kind == "values" and isinstance(value, Mapping):
        yield from (str(item) for item in value.values())
    elif kind == "url" and isinstance(value, str):
        password = url_password(value)
        if password:
            yield password
    elif kind == "env" and isinstance(value, str):
        yield env.get(value, "")
    elif kind == "keys":
        yield from _key_secrets(value)


def _key_secrets(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if _looks_secret(key) and isinstance(item, str | int):
                yield str(item)
            else:
                yield from _key_secrets(item)
    elif isinstance(value, list):
        for item in value:
            yield from _key_secrets(item)


# --- masking text -----------------------------------------------------------------------------

_TOKEN = r"A-Za-z0-9_\-"
"""Characters a secret's neighbours must not be for a match to be the whole value."""

KEY_SHAPES: tuple[str, ...] = (
    # Anthropic: sk-ant-api03-… API keys, sk-ant-admin01-… Admin API keys
    # (https://docs.anthropic.com/en/api/overview, https://docs.anthropic.com/en/api/administration-api).
    # OpenAI: sk-proj-… project keys, sk-svcacct-… service-account keys, legacy sk-… user keys
    # (https://platform.openai.com/docs/api-reference/authentication); OpenAI-compatible services
    # reached through base_url use the same prefix (OpenRouter sk-or-v1-…, DeepSeek sk-…).
    r"sk-[A-Za-z0-9_\-]{20,}",
    # Groq gsk_… (https://console.groq.com/docs/quickstart) and xAI xai-…
    # (https://docs.x.ai/docs/overview): OpenAI-compatible endpoints documented in docs/providers.md.
    r"gsk_[A-Za-z0-9]{20,}",
    r"xai-[A-Za-z0-9]{20,}",
    # Google API keys (Gemini's OpenAI-compatible endpoint, https://ai.google.dev/gemini-api/docs/openai).
    r"AIza[A-Za-z0-9_\-]{35}",
)
"""The API-key shapes of the supported providers, masked whatever configured them. A match must
be a whole token holding a digit as well as letters (a key's random part), so a hyphenated word
such as ``sk-learn-compatible-wrapper`` is left alone."""

_KEY_SHAPE = re.compile(
    rf"(?<![{_TOKEN}])(?=[{_TOKEN}]*[0-9])(?=[{_TOKEN}]*[A-Za-z])(?:{'|'.join(KEY_SHAPES)})(?![{_TOKEN}])"
)

_END = r"""(?<![)\]>.,:;!?])"""
"""A secret's last character is none of these: a closing bracket or a sentence's punctuation
right after a secret is the text's, not the secret's (``(password=hunter22).`` keeps ``).``)."""

_CREDENTIAL = (
    rf"""(?![A-Z]?[a-z]{{1,19}}(?![{_TOKEN}~+/=]|\.[{_TOKEN}]))"""
    rf"""[A-Za-z0-9\-._~+/]+=*{_END}(?![{_TOKEN}~+/=])"""
)
"""A bearer or basic credential (RFC 6750's b64token) that does not read as an ordinary word:
letters alone, at most the first upper-case, under 20 of them (``a bearer token``, ``Bearer
Token``) are prose, not a credential; anything with a digit, a second capital, a symbol or
length is masked. It is a whole token: ``bearer password=…`` is left to the ``password`` pattern."""

_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # A header line or a header in a dict's repr: the scheme stays, the credential goes; a
    # placeholder such as <token> is no credential.
    (
        re.compile(
            r"""(?i)((?:proxy-)?authorization['"]?\s*[:=]\s*['"]?)(?:(bearer|basic|token)\s+)?+"""
            rf"""(?!<[^\s>]*>)[^\s'",;}}]+{_END}"""
        ),
        lambda match: f"{match.group(1)}{match.group(2) + ' ' if match.group(2) else ''}{MASK}",
    ),
    (re.compile(rf"\b((?i:bearer|basic))\s+{_CREDENTIAL}"), r"\1 " + MASK),
    (
        re.compile(
            r"""(?i)\b((?:x-)?api[-_]?key|access[-_]?token|refresh[-_]?token|client[-_]?secret|password|passwd)"""
            rf"""(['"]?\s*[:=]\s*['"]?)[^\s'",;&}}]+{_END}"""
        ),
        r"\1\2" + MASK,
    ),
    # URL user info with a password: postgresql://user:secret@host.
    (re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@'\"]+:)[^\s@/'\"]+@"), r"\1" + MASK + "@"),
    (_KEY_SHAPE, MASK),
)


class Redactor:
    """Masks secrets in text: the configured ``values`` given (each as a whole token, from
    :data:`MIN_SECRET_CHARS` characters), then the credential patterns and :data:`KEY_SHAPES`.

    ``redact`` costs a few regular expression scans of the text: it is for error texts and log
    lines, not for the event stream's deltas. Raises nothing; text without a secret comes back
    equal.
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        # Longest first, so a secret containing another is masked whole.
        ordered = sorted({value for value in values if len(value) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        self._literal = (
            re.compile(rf"(?<![{_TOKEN}])(?:{'|'.join(map(re.escape, ordered))})(?![{_TOKEN}])")
            if ordered
            else None
        )

    def redact(self, text: str) -> str:
        """``text`` with every secret masked as :data:`MASK`."""
        if self._literal is not None:
            text = self._literal.sub(MASK, text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


def redactor_for(settings: BaseModel, environ: Mapping[str, str] | None = None) -> Redactor:
    """The process's :class:`Redactor`: every secret ``settings`` holds or names
    (:func:`secret_values`), with the patterns."""
    return Redactor(secret_values(settings, environ))


__all__ = [
    "KEY_SHAPES",
    "MASK",
    "MIN_SECRET_CHARS",
    "SECRET_KEY",
    "Redactor",
    "SecretKind",
    "redacted_settings",
    "redactor_for",
    "secret",
    "secret_values",
    "url_password",
]
