"""Every Python snippet in the README, the docs site and the guides runs as written (against a
real sidecar).

A snippet is a fenced ``python`` block of README.md, middleware/README.md, every page of the docs
site (``docs/**/*.md``) or CONTRIBUTING.md. Snippets that talk to a sidecar use the address
``127.0.0.1:50051``; the test points them at a real ``turnwire serve`` process on a free port
instead. A block whose first line is ``# not run: <why>`` is only compiled.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support.sidecar import SidecarProcess

from turnwire.hooks import Middleware
from turnwire.tools import PythonTool, Tool

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [
    REPO / "README.md",
    REPO / "middleware" / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),  # every page of the docs site (mkdocs.yml)
    REPO / "CONTRIBUTING.md",
]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
_ADDRESS = "127.0.0.1:50051"


def _snippets(block: re.Pattern[str] = _BLOCK) -> list[Any]:
    """Every ``block`` of the documents, as a param named ``document:line#n``."""
    found = []
    for document in DOCUMENTS:
        if not document.exists():
            continue
        text = document.read_text()
        for number, match in enumerate(block.finditer(text), start=1):
            line = text[: match.start()].count("\n") + 2
            found.append(pytest.param(match.group(1), id=f"{document.relative_to(REPO)}:{line}#{number}"))
    return found


SNIPPETS = _snippets()


def test_the_documents_have_python_snippets() -> None:
    assert len(SNIPPETS) >= 5  # the README's client, the tool, hook and client examples at least


def test_every_page_of_the_docs_site_is_covered() -> None:
    """The pages ``mkdocs.yml`` lists are the pages this test reads (a page in a new folder too)."""
    import yaml

    def pages(nav: Any) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, dict):
            return [page for value in nav.values() for page in pages(value)]
        return [page for item in nav for page in pages(item)]

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = {REPO / "docs" / page for page in pages(config["nav"])}
    assert listed == {document for document in DOCUMENTS if document.is_relative_to(REPO / "docs")}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # The hooks guide reads a hook timeline (a middleware and events.hook_timeline); the
    # approval example of docs/api/python.md needs an approval tool; everything else is the
    # embedded default.
    config = {
        "middleware": [{"path": "turnwire.middlewares:HookLogger"}],
        "events": {"hook_timeline": True},
        "tools": {"require_approval": ["get_current_time"]},
    }
    process = SidecarProcess(workdir=tmp_path_factory.mktemp("snippets"), config=config)
    process.start_blocking()
    yield process
    process.kill()


@pytest.mark.parametrize("code", SNIPPETS)
def test_snippet_runs(code: str, sidecar: SidecarProcess, tmp_path: Path) -> None:
    """Run the snippet; then every middleware class it defines must construct with its defaults
    and implement a hook, and every tool it defines must be a :class:`turnwire.tools.Tool`."""
    compile(code, "<snippet>", "exec")  # a SyntaxError names the snippet
    if code.startswith("# not run:"):
        return
    module = tmp_path / "snippet.py"
    module.write_text(code.replace(_ADDRESS, sidecar.target))
    namespace: dict[str, Any] = {"__name__": "snippet", "__file__": str(module)}
    # Snippets call asyncio.run themselves: this test is synchronous, so no loop is running.
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    for value in list(namespace.values()):
        if isinstance(value, type) and issubclass(value, Middleware) and value.__module__ == "snippet":
            assert value().implemented_hooks(), f"{value.__name__} implements no hook"
        if isinstance(value, PythonTool):
            assert isinstance(value, Tool) and value.input_schema.get("type") == "object"


_SHELL_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _buf_curl_commands() -> list[str]:
    """The ``buf curl`` commands of the README and the docs pages (continuation lines joined), as
    written."""
    commands = []
    for block in _SHELL_BLOCK.finditer("\n".join(document.read_text() for document in DOCUMENTS)):
        for command in block.group(1).replace("\\\n", " ").splitlines():
            if "buf curl" in command:
                commands.append(command.strip())
    return commands


def test_the_buf_curl_commands_run(sidecar: SidecarProcess) -> None:
    """``buf curl`` against the sidecar: it lists the service and a Chat streams to its TurnEnd."""
    import shlex
    import subprocess

    commands = _buf_curl_commands()
    assert len(commands) >= 2
    outputs = []
    for command in commands:
        argv = shlex.split(command.replace(_ADDRESS, sidecar.target))
        run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, (command, run.stderr)
        outputs.append(run.stdout)
    assert "turnwire.v1.ChatService" in outputs[0].splitlines()
    assert '"turnEnd"' in outputs[1] and "TURN_STATUS_COMPLETED" in outputs[1]


_YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.DOTALL | re.MULTILINE)
_NOT_TURNWIRE = ("apiVersion", "services", "version")  # Kubernetes, compose: other tools' files


@pytest.mark.parametrize("text", _snippets(_YAML_BLOCK))
def test_config_snippet_is_a_valid_configuration(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``yaml`` block of the docs that is a Turnwire config loads as written (the files it
    names, certificates say, are created empty beside it)."""
    import yaml

    from turnwire_server.config import load_settings

    data = yaml.safe_load(text)
    assert isinstance(data, dict), "a config snippet is a mapping of sections"
    if any(key in data for key in _NOT_TURNWIRE):
        return
    monkeypatch.chdir(tmp_path)
    for name in re.findall(r"[\w./-]+\.(?:pem|crt|key|json)\b", text):
        if not name.startswith("/"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("")
    path = tmp_path / "turnwire.yaml"
    path.write_text(text)
    load_settings(path)


_ENV_SETTING = re.compile(r"\b\w+_env:\s*(TURNWIRE_\w+)")


def test_no_variable_a_setting_names_is_one_serve_warns_about() -> None:
    """A ``*_env`` setting in the docs (``secret_env``, ``tokens_env``, ``password_env`` …) names a
    variable that ``turnwire serve`` does not then warn about as a misspelt ``TURNWIRE_*`` setting:
    a reader who copies the example gets no warning about it."""
    from turnwire_server.config import Settings
    from turnwire_server.config_hints import unknown_variables

    files = [*DOCUMENTS, *sorted((REPO / "deploy").rglob("*.yaml"))]
    named = {
        f"{path.relative_to(REPO)}: {name}": name
        for path in files
        if path.exists()
        for name in _ENV_SETTING.findall(path.read_text())
    }
    warned = {where: unknown_variables({name: "x"}, Settings) for where, name in named.items()}
    assert {where: warnings for where, warnings in warned.items() if warnings} == {}


async def test_the_full_sample_config_says_what_it_needs_and_runs_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial 3: the full sample of the configuration (tls files, my_package tools and hooks; the
    README's then, docs/configuration.md's now) could not run as is and did not say so. The
    paragraph before it names each part that needs the reader's files; without those parts the
    sample starts a sidecar as it stands."""
    import yaml

    from turnwire_server.app import start
    from turnwire_server.config import load_settings

    page = (REPO / "docs" / "configuration.md").read_text()
    block = next(match for match in _YAML_BLOCK.finditer(page) if "my_package" in match.group(1))
    before = page[: block.start()].rsplit("\n\n", 2)[-2]
    assert "illustration" in before
    for part in ("`tls:`", "`server.pem`", "`tools.python`", "`middleware`", "`my_package`", "`remote:`"):
        assert part in before, part
    data = yaml.safe_load(block.group(1))
    del data["tls"], data["middleware"]
    data["tools"].pop("python")
    data["listen"] = "127.0.0.1:0"
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "turnwire.yaml"
    path.write_text(yaml.safe_dump(data))
    sidecar = await start(load_settings(path))
    try:
        assert sidecar.port > 0
    finally:
        await sidecar.stop()


def test_the_hook_timeline_snippet_prints_one_readable_line_per_hook(
    sidecar: SidecarProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trial 3: the hooks guide's §3 snippet printed the timeline as a raw protobuf ``Value``
    (``list_value { values { struct_value { fields { … }``). It prints plain lines now."""
    guide = (REPO / "middleware" / "README.md").read_text()
    (code,) = [match.group(1) for match in _BLOCK.finditer(guide) if "hook_timeline" in match.group(1)]
    module = tmp_path / "timeline.py"
    module.write_text(code.replace(_ADDRESS, sidecar.target))
    capsys.readouterr()
    exec(compile(module.read_text(), str(module), "exec"), {"__name__": "snippet"})
    lines = capsys.readouterr().out.splitlines()
    assert lines, "the snippet printed no timeline"
    for line in lines:
        assert re.fullmatch(r"HookLogger\.\w+: \d+\.\d\d ms, \d+ call\(s\)( FAILED)?", line), line
    assert "HookLogger.before_turn" in " ".join(lines)


def test_the_cli_exit_codes_are_the_documented_ones() -> None:
    """A fresh-user trial: the CLI's exit codes 1 and 2 were documented nowhere."""
    from turnwire_server.cli import exit_codes

    text = " ".join((REPO / "docs/getting-started.md").read_text().split())
    documented = re.search(r"\*\*Exit codes\*\*(.*?could not be reached)", text)
    assert documented is not None
    said = {int(code) for code in re.findall(r"\b(\d) when", documented.group(1))}
    codes = {value for name, value in vars(exit_codes).items() if name.startswith("EXIT_")}
    assert said == codes == {0, 1, 2, 3}
