"""Start-up errors through the real ``turnwire serve`` command: each names the field or file and the
fix, exits non-zero without a traceback, and writes nothing (no store file) before it is found.

The samples are a first-hour user's (issue 16); each stands for a kind: every config error names
the field and the fix, every start-up check runs before the store is created.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from support.sidecar import free_port, run_turnwire


async def _serve(
    tmp_path: Path, config: object, *extra: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    path = tmp_path / "turnwire.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    store = tmp_path / "store.db"
    # A free port unless the test names one: a sidecar on the default port (a developer's own,
    # another suite's) would make every start fail at "port in use" before its own error.
    named = "--listen" in extra or (isinstance(config, dict) and "listen" in config)
    listen = () if named else ("--listen", f"127.0.0.1:{free_port()}")
    run = await run_turnwire(
        "serve", "--config", str(path), "--store", f"sqlite:///{store}", *listen, *extra, env=env, timeout=60
    )
    assert run.code != 0, run
    assert "Traceback" not in run.stderr, run.stderr
    assert not store.exists(), "the store was created before the start-up check failed"
    return run.code, run.stderr


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"providers": {"openai": {"base_url": "http://127.0.0.1:1/v1"}}},
            "providers.openai: no `type:` given; add `type: openai`",
        ),
        ({"providers": {"x": {"type": "antropic"}}}, "did you mean 'anthropic'?"),
        ({"tool": {"demo": True}}, "tool: unknown field; did you mean 'tools'?"),
        ("- listen: 127.0.0.1:1\n- store: x\n", "the top level is a list; it must be a mapping of sections"),
        (
            {"providers": {"o": {"type": "openai", "api_key_env": None, "default_headers": {"X-A": "b "}}}},
            "providers.o.default_headers: header X-A: its value has leading or trailing whitespace",
        ),
    ],
)
async def test_a_config_error_names_the_field_and_the_fix(
    tmp_path: Path, config: object, expected: str
) -> None:
    code, stderr = await _serve(tmp_path, config)
    assert code == 2
    assert expected in stderr


async def test_every_missing_api_key_is_reported_at_once(tmp_path: Path) -> None:
    config = {
        "providers": {
            "a": {"type": "anthropic", "api_key_env": "TW_TEST_KEY_A"},
            "o": {"type": "openai", "api_key_env": "TW_TEST_KEY_O"},
        }
    }
    _, stderr = await _serve(tmp_path, config)
    assert "2 providers cannot start" in stderr
    assert "TW_TEST_KEY_A" in stderr and "TW_TEST_KEY_O" in stderr


async def test_a_function_without_the_tool_decorator_says_to_add_it(tmp_path: Path) -> None:
    (tmp_path / "plain_tools.py").write_text("def get_weather(city: str) -> str:\n    return 'sunny'\n")
    config = {"tools": {"python": ["plain_tools:get_weather"]}}
    _, stderr = await _serve(tmp_path, config, env={"PYTHONPATH": str(tmp_path)})
    assert "plain_tools:get_weather is a plain function get_weather(city: str) -> str, not a tool" in stderr
    # Trial 4: the pointer leads to where @tool is documented (docs/tools.md, "Python tools in the
    # sidecar"; it was the README's Tools section before the docs site).
    assert "@tool(InputModel) from turnwire.tools (docs/tools.md)" in stderr
    assert len(stderr.splitlines()) <= 3, stderr


async def test_a_port_in_use_is_named_before_the_store_is_created(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        _, stderr = await _serve(tmp_path, {}, "--listen", f"127.0.0.1:{port}")
    assert f"cannot listen on 127.0.0.1:{port}: port {port} is in use" in stderr
    assert "add_port.cc" not in stderr  # no gRPC C-core log line


async def test_a_config_error_is_named_even_while_the_port_is_held(tmp_path: Path) -> None:
    """Fresh-user trial (stop 45): a sidecar still draining on the port hid the configuration
    error behind "port in use"; the error to fix comes first."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        _, stderr = await _serve(
            tmp_path, {"default_model": "openai:gpt-4o"}, "--listen", f"127.0.0.1:{port}"
        )
    assert "names provider 'openai', which is not configured" in stderr
    assert "is in use" not in stderr


async def test_a_host_that_is_not_this_machine_says_so(tmp_path: Path) -> None:
    _, stderr = await _serve(tmp_path, {}, "--listen", f"192.0.2.1:{free_port()}")  # TEST-NET-1
    assert "is not an address of this machine" in stderr


async def test_a_tool_module_not_on_the_path_says_pythonpath(tmp_path: Path) -> None:
    _, stderr = await _serve(tmp_path, {"tools": {"python": ["not_on_path_tools:get"]}})
    assert "No module named 'not_on_path_tools': put the folder that holds not_on_path_tools.py" in stderr
    assert "PYTHONPATH" in stderr


async def test_a_default_model_of_an_unconfigured_well_known_provider_says_what_to_add(
    tmp_path: Path,
) -> None:
    _, stderr = await _serve(tmp_path, {"default_model": "openai:gpt-4o"})
    assert "names provider 'openai', which is not configured" in stderr
    assert "add openai: {type: openai, api_key_env: OPENAI_API_KEY} under providers:" in stderr
    assert "keep scripted listed there too (a providers: section replaces the embedded providers" in stderr


async def test_a_providers_section_without_scripted_says_it_replaced_the_offline_model(
    tmp_path: Path,
) -> None:
    """Fresh-user trial: a config whose providers: listed only openai refused to start on the
    default_model it never set, without saying that the section replaced scripted."""
    config = {"providers": {"openai": {"type": "openai", "api_key_env": "TW_TEST_OPENAI_KEY"}}}
    _, stderr = await _serve(tmp_path, config, env={"TW_TEST_OPENAI_KEY": "sk-test"})
    assert "default_model (not set, so the embedded scripted:demo)" in stderr
    assert "list scripted: {} in it to keep the offline model" in stderr
    assert "or set default_model to a model of a configured provider (for example openai:<model>)" in stderr


async def test_a_second_serve_on_the_same_config_names_the_grpc_port(tmp_path: Path) -> None:
    """Issue 32 item 19: with metrics on, a second `serve` of a running configuration reported
    `metrics.listen: cannot listen on …`, the port of the two it matters least for."""
    port, metrics_port = free_port(), free_port()
    taken = [socket.socket(), socket.socket()]
    for sock, bound in zip(taken, (port, metrics_port), strict=True):
        sock.bind(("127.0.0.1", bound))
        sock.listen()
    config = {
        "listen": f"127.0.0.1:{port}",
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
    }
    try:
        code, stderr = await _serve(tmp_path, config)
    finally:
        for sock in taken:
            sock.close()
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}: port {port} is in use" in stderr, stderr
    assert "metrics.listen" not in stderr


async def test_under_json_logging_the_start_error_is_a_json_log_line(tmp_path: Path) -> None:
    """Stop 67: with ``logging.format: json`` every line but the start error was JSON, so a log
    pipeline parsing JSON lines dropped the one line that said why the process exited."""
    config = {"logging": {"format": "json"}, "default_model": "openai:gpt-4o"}
    _, stderr = await _serve(tmp_path, config)
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]  # each one JSON
    (error,) = [line for line in lines if line["level"] == "CRITICAL"]
    assert error["logger"] == "turnwire.server"
    assert error["message"].startswith("cannot start: default_model")
    assert "names provider 'openai', which is not configured" in error["message"]
