"""Secrets in the configuration and in log text (``turnwire_server.redaction``), the log line
formats and context ids (``logs``, ``log_context``) and the bounded model label of the metrics."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from pydantic import BaseModel, Field, SecretStr

from turnwire_server.config import Settings
from turnwire_server.engine.metrics import model_label
from turnwire_server.log_context import bind
from turnwire_server.logs import configure_logging
from turnwire_server.redaction import MASK, Redactor, redacted_settings, secret, secret_values


class Inner(BaseModel):
    token: SecretStr
    headers: dict[str, str] = Field(default_factory=dict, json_schema_extra=secret("values"))


class Outer(BaseModel):
    name: str = "plain"
    password: str = Field("pw-value-1", json_schema_extra=secret())
    url: str = Field("https://user:url-pass-1@host/x", json_schema_extra=secret("url"))
    key_env: str = Field("MY_KEY", json_schema_extra=secret("env"))
    options: dict[str, Any] = Field(default_factory=dict, json_schema_extra=secret("keys"))
    inner: list[Inner] = Field(default_factory=list)


SAMPLE = Outer(
    options={"level": 3, "client_secret": "opt-secret-1", "deep": [{"authToken": "deep-1", "tokens": 5}]},
    inner=[Inner(token=SecretStr("secret-str-1"), headers={"X-Api-Key": "hdr-value-1"})],
)


def test_redacted_settings_masks_each_kind_where_it_sits() -> None:
    shown = redacted_settings(SAMPLE)
    assert shown["name"] == "plain"
    assert shown["password"] == MASK
    assert shown["url"] == f"https://user:{MASK}@host/x"
    assert shown["key_env"] == "MY_KEY"  # the variable's name is no secret
    assert shown["options"] == {"level": 3, "client_secret": MASK, "deep": [{"authToken": MASK, "tokens": 5}]}
    assert shown["inner"] == [{"token": MASK, "headers": {"X-Api-Key": MASK}}]


def test_secret_values_finds_what_the_marks_point_at() -> None:
    found = secret_values(SAMPLE, {"MY_KEY": "env-value-1", "PGPASSWORD": "libpq-pass-1"})
    assert found == {
        "pw-value-1",
        "url-pass-1",
        "env-value-1",
        "opt-secret-1",
        "deep-1",
        "secret-str-1",
        "hdr-value-1",
        "libpq-pass-1",
    }


def test_the_settings_mark_their_secrets() -> None:
    settings = Settings.model_validate(
        {
            "store": {"url": "postgresql://u:store-pass-1@h/db", "password_env": "PW"},
            "providers": {"anthropic": {"type": "anthropic", "default_headers": {"x-api-key": "hdr-1"}}},
            "tools": {
                "mcp": [{"name": "m", "url": "http://h/mcp", "headers": {"Authorization": "Bearer t-1"}}]
            },
        }
    )
    found = secret_values(settings, {"ANTHROPIC_API_KEY": "sk-ant-1", "PW": "pw-env-1"})
    assert {"store-pass-1", "hdr-1", "Bearer t-1", "sk-ant-1", "pw-env-1"} <= found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc.def-123", f"Authorization: Bearer {MASK}"),
        ("{'authorization': 'Basic dXNlcjpwYXNz'}", f"{{'authorization': 'Basic {MASK}'}}"),
        ('"Proxy-Authorization": "token xyz"', f'"Proxy-Authorization": "token {MASK}"'),
        ("sent bearer eyJhbGciOi.x.y to it", f"sent bearer {MASK} to it"),
        ("x-api-key: k-123", f"x-api-key: {MASK}"),
        ("url?api_key=abc&x=1", f"url?api_key={MASK}&x=1"),
        ('{"password": "hunter22"}', f'{{"password": "{MASK}"}}'),
        ("postgresql://tw:pa55@db:5432/tw", f"postgresql://tw:{MASK}@db:5432/tw"),
        ("key sk-ant-api03-abcdefghijklmnop1234 here", f"key {MASK} here"),
        ("nothing secret: 42 turns, model scripted:demo", "nothing secret: 42 turns, model scripted:demo"),
    ],
)
def test_the_patterns_mask_credentials_of_any_origin(text: str, expected: str) -> None:
    assert Redactor().redact(text) == expected


def test_literal_secrets_are_masked_and_short_values_are_not_searched_for() -> None:
    redactor = Redactor(['odd"sec\\ret-ü', "abc"])
    assert redactor.redact('value odd"sec\\ret-ü, abc') == f"value {MASK}, abc"


async def test_a_json_line_stays_json_whatever_the_secret(captured: tuple[io.StringIO, Any]) -> None:
    """Masking happens before serialization: a secret with quotes and backslashes, or one that is
    also a JSON literal (``true``), never breaks a line."""
    stream, _ = captured
    configure_logging("info", "json", Redactor(['odd"sec\\ret-ü', "true"]), stream=stream)
    logging.getLogger("turnwire.test").warning(
        'got odd"sec\\ret-ü', extra={"flag": True, "detail": {"nested": 'odd"sec\\ret-ü'}}
    )
    record = json.loads(stream.getvalue())
    assert record["message"] == f"got {MASK}"
    assert record["flag"] is True and record["detail"] == {"nested": MASK}


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, list[logging.Handler]]]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    yield stream, saved[0]
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


async def test_json_lines_carry_context_ids_and_no_secret(captured: tuple[io.StringIO, Any]) -> None:
    stream, _ = captured
    configure_logging("debug", "json", Redactor(["my-api-key-1"]), stream=stream)
    log = logging.getLogger("turnwire.test")
    log.info("outside any call")
    bind("conv-1", "req-1")
    context = trace.SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True)
    with trace.use_span(trace.NonRecordingSpan(context)):
        log.debug("calling with %s", "my-api-key-1", extra={"stage": "stream"})
    outside, inside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert outside.keys() == {"timestamp", "level", "logger", "message"}
    assert inside["message"] == f"calling with {MASK}"
    assert (inside["conversation_id"], inside["request_id"]) == ("conv-1", "req-1")
    assert inside["trace_id"] == f"{0xABC:032x}" and inside["span_id"] == f"{0xDEF:016x}"
    assert (inside["level"], inside["logger"], inside["stage"]) == ("DEBUG", "turnwire.test", "stream")


async def test_text_lines_end_with_the_known_context_ids(captured: tuple[io.StringIO, Any]) -> None:
    stream, _ = captured
    configure_logging("info", "text", stream=stream)
    bind("conv-2")
    try:
        raise ValueError("Authorization: Bearer zzz")
    except ValueError:
        logging.getLogger("turnwire.test").exception("failed")
    first, *traceback = stream.getvalue().splitlines()
    assert first.endswith(" ERROR turnwire.test failed conversation_id=conv-2")
    assert traceback[-1] == f"ValueError: Authorization: Bearer {MASK}"


def test_the_model_label_is_bounded_by_the_configuration() -> None:
    known = frozenset({"anthropic:claude-x", "scripted:demo"})
    assert model_label("anthropic:claude-x", known) == "anthropic:claude-x"
    assert model_label("anthropic:made-up-by-a-client", known) == "anthropic:other"
    assert model_label("anything:goes", None) == "anything:goes"


def test_a_configured_value_is_masked_as_a_whole_token_only() -> None:
    """Issue 32 item 2: with an API key ``mock`` the provider name ``mock-openai`` stayed intact
    only by luck of length; a value is masked where it stands whole, never inside a word."""
    redactor = Redactor(["mock", "hunter2-pass", "sk-live-abcdefgh"])
    assert redactor.redact("provider mock-openai failed: mock") == "provider mock-openai failed: mock"
    assert redactor.redact("pw hunter2-pass, again 'hunter2-pass'") == f"pw {MASK}, again '{MASK}'"
    assert redactor.redact("xhunter2-pass hunter2-passes hunter2-pass-2") == (
        "xhunter2-pass hunter2-passes hunter2-pass-2"
    )


@pytest.mark.parametrize(
    "key",
    [
        "sk-proj-Zq8RkT2vLx9NwB4cY7uJm3HsPd6Fg1Ae5Ki0Oo",
        "sk-svcacct-Zq8RkT2vLx9NwB4cY7uJm3HsPd6Fg1Ae",
        "sk-ant-api03-z0zjHHXo5k3zD2havvfqiZYJe9ENlwI1trcQC4py-48GXRgAA",
        "sk-ant-admin01-Zq8RkT2vLx9NwB4cY7uJm3HsPd6Fg1Ae",
        "sk-or-v1-0123456789abcdef0123456789abcdef",
        "gsk_Zq8RkT2vLx9NwB4cY7uJm3HsPd6Fg1Ae",
        "xai-Zq8RkT2vLx9NwB4cY7uJm3HsPd6Fg1Ae",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    ],
)
def test_the_key_shapes_of_the_supported_providers_are_masked_unconfigured(key: str) -> None:
    assert Redactor().redact(f"Incorrect API key provided: {key}.") == f"Incorrect API key provided: {MASK}."


@pytest.mark.parametrize(
    "text",
    [
        "the sk-learn-compatible-wrapper-for-models failed",
        "task-0123456789abcdefghijklmnop is running",
        "risk-assessment-report-2024-final-version",
        "OpenAI shows sk-proj-****************************cdef only",
    ],
)
def test_words_that_merely_start_like_a_key_are_left_alone(text: str) -> None:
    assert Redactor().redact(text) == text


def test_secret_values_include_secrets_inside_containers() -> None:
    settings = Settings.model_validate(
        {
            "tracing": {
                "enabled": True,
                "endpoint": "http://c:4317",
                "headers": {"x-token": "otlp-hdr-secret-1"},
            }
        }
    )
    assert "otlp-hdr-secret-1" in secret_values(settings, {})
