"""The kit pages' sidecar configs (docs/api/kit-python.md, kit-typescript.md, kit-go.md): each
wires the page's program in as a remote middleware and a tool host and gives the offline scripted
model a script that calls the page's own tools (docs/providers.md, "scripted"), so a reader
without an API key sees their tool called.

Every page's config loads as the sidecar's configuration, and its script calls only tools the
page's program defines; the Python page's program and config run together under a real
``turnwire serve`` (the TypeScript and Go pages' programs run under their own tests:
clients/node/tests/kit_docs.test.mjs, tests/test_release_artifacts.py).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.sidecar import SidecarFactory, run_turnwire

from turnwire.kit import start
from turnwire_client import TurnwireClient, collect
from turnwire_server.config import Settings

PAGES = Path(__file__).resolve().parents[2] / "docs" / "api"
ADDRESS = "127.0.0.1:7001"
"""The address every page's program serves on and its config names."""

LANGUAGES = {"kit-python.md": "python", "kit-typescript.md": "ts", "kit-go.md": "go"}


def _page(name: str) -> tuple[str, dict[str, Any]]:
    """A page's first program (its language's first code block) and its sidecar config (the
    first YAML block that starts with ``middleware:``)."""
    text = (PAGES / name).read_text()
    program = re.search(rf"^```{LANGUAGES[name]}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    config = re.search(r"^```yaml\n(middleware:.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert program and config, f"docs/api/{name} has no program or sidecar config block"
    return program.group(1), yaml.safe_load(config.group(1))


@pytest.mark.parametrize("name", list(LANGUAGES))
def test_each_kit_page_config_loads_and_its_script_calls_the_pages_tools(name: str) -> None:
    program, config = _page(name)
    settings = Settings.model_validate(config)
    provider, _, script = settings.default_model.partition(":")
    assert provider == "scripted", f"{name}: default_model {settings.default_model} is not offline"
    steps = config["providers"]["scripted"]["scripts"][script]
    called = {call["name"] for step in steps for call in step.get("tool_calls", [])}
    assert called, f"{name}: script {script} calls no tool"
    for tool in called:
        # Each tool's name is a string literal in the page's program (or its function's name).
        assert re.search(rf"['\"`]{tool}['\"`]|def {tool}\(", program), (
            f"{name}: no tool {tool!r} in the program"
        )
    hosts = [host["address"] for host in config["tools"]["hosts"]]
    remotes = [entry["remote"]["address"] for entry in config["middleware"]]
    assert hosts == remotes == [ADDRESS] and f'"{ADDRESS}"' in program.replace("'", '"')


async def test_the_python_page_runs_as_written_offline(sidecar_factory: SidecarFactory) -> None:
    """The page's program (its policy and its tool) under a sidecar with the page's config: the
    scripted model calls ``refund`` in US dollars, the policy has the tool run in euros, and the
    page's ``turnwire chat`` shows the call as the model made it (the stored call keeps the model's
    input) and the tool's result of the policy's input, line for line as the page prints them.

    Before the fresh-user trial the page said the chat showed the hook's decision, which it never
    does, in an example where the tool's default currency was the policy's."""
    program, config = _page("kit-python.md")
    namespace: dict[str, Any] = {"__name__": "kit_page"}
    exec(compile(program, "kit-python.md", "exec"), namespace)
    served = await start(hooks=namespace["Policy"](), tools=[namespace["refund"]], address="127.0.0.1:0")
    try:
        address = f"127.0.0.1:{served.port}"
        wired = json.loads(json.dumps(config).replace(ADDRESS, address))
        sidecar = await sidecar_factory({**wired, "tools": {**wired["tools"], "demo": False}}).start()
        async with TurnwireClient(sidecar.target) as client:
            result = await collect(client.chat("kit-page", "refund A-17"))
        command, shown = _console("kit-python.md")
        chat = await run_turnwire(*shlex.split(command)[1:], "--target", sidecar.target)
    finally:
        await served.stop(0)
    assert result.ok, (result.error, sidecar.log_text())
    (call,) = result.tool_calls
    assert call.tool_name == "refund"
    assert call.input == {"order_id": "A-17", "amount_cents": 1200, "currency": "USD"}
    assert call.output == {"refunded": 1200, "currency": "EUR"}
    assert result.text == "Refunded 12 EUR."
    assert chat.code == 0, chat
    calls = [line for line in shown if line.startswith(("→", "←"))]
    assert calls, "the page's console block shows no call"
    assert [line for line in chat.stdout.splitlines() if line.startswith(("→", "←"))] == calls, chat.stdout


def _console(name: str) -> tuple[str, list[str]]:
    """A page's first ``console`` block: its command (after ``$ ``) and the lines it shows."""
    text = (PAGES / name).read_text()
    block = re.search(r"^```console\n\$ (.*?)\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert block, f"docs/api/{name} has no console block"
    return block.group(1), block.group(2).splitlines()
