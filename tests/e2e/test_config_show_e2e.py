"""``turnwire config show``: the configuration ``serve`` would run with (flags, ``TURNWIRE_*``
variables, the file, defaults), printed as YAML with every secret masked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.sidecar import run_turnwire

STORE_PASSWORD = "pg-pass-5ecret"
HEADER_KEY = "hdr-key-5ecret"
BEARER = "bearer-tok-5ecret"
CHILD_TOKEN = "child-tok-5ecret"
OPTION_KEY = "option-key-5ecret"
API_KEY = "sk-ant-api-key-5ecret-0123456789"

CONFIG = f"""
store:
  url: postgresql://tw:{STORE_PASSWORD}@db.internal:5432/turnwire
  password_env: TW_PG_PASSWORD
providers:
  scripted: {{type: scripted}}
  anthropic: {{type: anthropic, default_headers: {{x-api-key: {HEADER_KEY}}}}}
tools:
  mcp:
    - {{name: search, url: "http://127.0.0.1:8000/mcp", headers: {{Authorization: "Bearer {BEARER}"}}}}
    - {{name: files, command: npx, env: {{GITHUB_TOKEN: {CHILD_TOKEN}}}}}
middleware:
  - path: turnwire.middlewares:HookLogger
    options: {{level: info, api_key: {OPTION_KEY}}}
limits:
  max_steps: 3
"""


async def test_config_show_prints_effective_values_with_secrets_masked(tmp_path: Path) -> None:
    config = tmp_path / "turnwire.yaml"
    config.write_text(CONFIG)
    result = await run_turnwire(
        "config",
        "show",
        "--config",
        str(config),
        "--listen",
        "127.0.0.1:6001",
        env={
            "TURNWIRE_LIMITS__MAX_STEPS": "7",  # the environment beats the file
            "TURNWIRE_LOG_LEVEL": "debug",  # the deprecated spelling still sets logging.level
            "TURNWIRE_METRICS__ENABLED": "true",
            "ANTHROPIC_API_KEY": API_KEY,
            "TW_PG_PASSWORD": STORE_PASSWORD,
        },
    )
    assert result.code == 0, result.stderr
    for secret in (STORE_PASSWORD, HEADER_KEY, BEARER, CHILD_TOKEN, OPTION_KEY, API_KEY):
        assert secret not in result.stdout
    shown = yaml.safe_load(result.stdout)

    # Effective values: flag, environment, file, defaults.
    assert shown["listen"] == "127.0.0.1:6001"
    assert shown["limits"]["max_steps"] == 7
    assert shown["limits"]["max_queued_turns_per_conversation"] == 32
    assert shown["logging"] == {"level": "debug", "format": "text"}
    assert shown["metrics"] == {"enabled": True, "listen": "127.0.0.1:9464"}
    assert shown["providers"]["anthropic"]["timeout_seconds"] == 600.0
    assert shown["event_loop"] == "auto"

    # Secrets masked where they sit; names of the variables holding them shown.
    assert shown["store"]["url"] == "postgresql://tw:***@db.internal:5432/turnwire"
    assert shown["store"]["password_env"] == "TW_PG_PASSWORD"
    assert shown["providers"]["anthropic"]["api_key_env"] == "ANTHROPIC_API_KEY"
    assert shown["providers"]["anthropic"]["default_headers"] == {"x-api-key": "***"}
    search, files = shown["tools"]["mcp"]
    assert search["headers"] == {"Authorization": "***"}
    assert search["url"] == "http://127.0.0.1:8000/mcp"
    assert files["env"] == {"GITHUB_TOKEN": "***"}
    assert shown["middleware"][0]["options"] == {"level": "info", "api_key": "***"}


async def test_config_show_refuses_an_invalid_configuration() -> None:
    result = await run_turnwire("config", "show", env={"TURNWIRE_LIMITS__MAX_STEPS": "0"})
    assert result.code == 2
    assert "limits.max_steps" in result.stderr
    assert result.stdout == ""


async def test_config_show_leaves_out_the_deprecated_log_level_when_unset() -> None:
    result = await run_turnwire("config", "show")
    assert result.code == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert "log_level" not in shown
    assert shown["logging"]["level"] == "info"


async def test_config_show_refuses_what_serve_refuses(tmp_path: Path) -> None:
    """Issue 32 item 19: a default_model no configured provider serves made `serve` exit 1, while
    `config show` printed the configuration and exited 0."""
    config = tmp_path / "turnwire.yaml"
    config.write_text("default_model: openai:gpt-4o-mini\n")
    shown = await run_turnwire("config", "show", "--config", str(config))
    assert shown.code == 2, shown
    assert shown.stdout == ""
    assert "serve would refuse this configuration: default_model:" in shown.stderr, shown.stderr
    assert "'openai'" in shown.stderr
    served = await run_turnwire("serve", "--config", str(config), "--store", f"sqlite:///{tmp_path / 'db'}")
    assert served.code == 1, served
    assert "default_model:" in served.stderr


async def test_a_variable_a_setting_names_is_not_warned_about(tmp_path: Path) -> None:
    """A fresh-user trial: the webhooks page's ``secret_env: TURNWIRE_WEBHOOK_SECRET`` made every
    start warn that the variable, which the sidecar reads, "is ignored"; a misspelt one still is."""
    config = tmp_path / "turnwire.yaml"
    config.write_text(
        "webhooks:\n  endpoints:\n"
        "    app: {url: 'https://app.example/hook', secret_env: TURNWIRE_WEBHOOK_SECRET}\n"
    )
    secret = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo="  # standard base64 of 26 bytes
    result = await run_turnwire(
        "config",
        "show",
        "--config",
        str(config),
        env={"TURNWIRE_WEBHOOK_SECRET": secret, "TURNWIRE_LIMIT__MAX_STEPS": "3"},
    )
    assert result.code == 0, result.stderr
    assert "TURNWIRE_WEBHOOK_SECRET" not in result.stderr
    assert "TURNWIRE_LIMIT__MAX_STEPS is ignored" in result.stderr


async def test_config_show_reads_the_file_turnwire_config_names(tmp_path: Path) -> None:
    """As ``serve`` does (its ``--config`` falls back to ``TURNWIRE_CONFIG``): config show
    printed the defaults instead, not the configuration serve would run with."""
    config = tmp_path / "turnwire.yaml"
    config.write_text("limits:\n  max_steps: 3\n")
    result = await run_turnwire("config", "show", env={"TURNWIRE_CONFIG": str(config)})
    assert result.code == 0, result.stderr
    assert yaml.safe_load(result.stdout)["limits"]["max_steps"] == 3


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (
            "tls: {cert_file: /nonexistent/tw.pem, key_file: /nonexistent/tw.key}",
            "tls.cert_file /nonexistent/tw.pem: no such file",
        ),
        ("auth: {enabled: true, tokens_file: /nonexistent/tokens.json}", "auth.tokens_file /nonexistent/"),
        (
            "webhooks: {endpoints: {app: {url: 'https://example.com/h', secret_env: TW_UNSET_SECRET}}}",
            "webhooks.endpoints.app.secret_env names the environment variable TW_UNSET_SECRET",
        ),
        (
            "store: {url: 'postgresql://tw@db.internal/turnwire', password_env: TW_UNSET_PASSWORD}",
            "store.url: store.password_env names the environment variable 'TW_UNSET_PASSWORD'",
        ),
    ],
)
async def test_config_show_refuses_the_files_and_secrets_serve_refuses(
    tmp_path: Path, config: str, said: str
) -> None:
    """A deploy's check with `config show` passed (exit 0) for a configuration whose files or
    secret variables made `serve` exit 1 at once: it checked the providers only."""
    path = tmp_path / "turnwire.yaml"
    path.write_text(config + "\n")
    shown = await run_turnwire("config", "show", "--config", str(path))
    assert shown.code == 2, shown
    assert shown.stdout == ""
    assert f"serve would refuse this configuration: {said}" in shown.stderr, shown.stderr
