"""The artifacts of ``make dist``, installed where the repository cannot be seen, each holding a
chat that calls a tool (docs/install.md).

``make dist`` runs once for the module, into a temporary directory (``DIST=``). Then:

- the three wheels go into a fresh virtual environment (pip, ``--find-links`` the dist folder; the
  other dependencies from the package index or pip's cache at the versions ``constraints.txt``
  pins, copied out beside it) and ``turnwire demo`` runs from a scratch directory;
- the npm tarball goes into a scratch npm project with TypeScript, where a typed program is
  compiled by ``tsc`` and chats with a real sidecar twice: ``TurnwireClient`` over gRPC and the
  browser entry's ``TurnwireWebClient`` over Connect (Node.js's fetch); the browser entry is also
  bundled for the browser platform, which fails on any Node.js module; and a typed hook server
  and tool host on the kit entry (``@turnwire/client/kit``) serves a second sidecar's chat;
- the Go module zip (``dist/goproxy``) is unpacked into the vendor directory of a scratch Go
  module, beside Debian's packages of its requirements at the versions its ``go.mod`` names, and
  two programs built in module mode (``-mod=vendor``, no module proxy): one chats with the sidecar,
  the other is docs/api/kit-go.md's typed tool host and policy hook on ``turnwire.dev/go/kit``,
  taken from the page as a user copies it, which serves a second sidecar's chat (listed in its
  config as the page says).

Slow (about a minute on 2 cores: the builds and installs), so marked ``packaging``
and ``e2e``: ``make check`` skips them and ``make test`` runs them once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from filelock import FileLock
from packaging.requirements import Requirement
from support.http_sidecar import http_base
from support.port_process import PortProcess
from support.sidecar import SidecarProcess, free_port
from support.waiting import wait_until

from turnwire_client import TurnResult, TurnwireClient, collect

REPO = Path(__file__).resolve().parents[1]
VERSION = (REPO / "VERSION").read_text().strip()
DEBIAN_GOPATH = Path("/usr/share/gocode")

pytestmark = [pytest.mark.e2e, pytest.mark.packaging]


def _run(command: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """Runs ``command``; returns its stdout, or fails the test with both streams."""
    run = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    assert run.returncode == 0, f"{' '.join(command)} failed:\n{run.stdout}\n{run.stderr}"
    return run.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``make dist`` wrote, in a temporary directory: built once for all pytest-xdist workers
    (their shared base directory, under a file lock). Two ``make dist`` at once in one checkout
    race on setuptools' release trees (``turnwire-VERSION/``), and this module's tests may run
    on several workers. Without xdist the base directory itself: its parent is the user's pytest
    folder, which every session (of every checkout) shares, and a dist built there by another
    checkout or an earlier commit would be taken for this one."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "release-dist"
    with FileLock(str(shared / "release-dist.lock")):
        if not (out / "built").is_file():
            _run(["make", "--no-print-directory", "dist", f"DIST={out}"], cwd=REPO, timeout=900)
            (out / "built").write_text("make dist finished\n")
    return out


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """A ``turnwire serve`` on the embedded defaults (scripted demo model and tools) with its HTTP
    listener on, for the clients under test."""
    process = SidecarProcess(
        tmp_path_factory.mktemp("artifacts-sidecar"), {"http": {"listen": f"127.0.0.1:{free_port()}"}}
    )
    process.start_blocking()
    yield process
    process.kill()


def test_dist_holds_every_artifact_at_the_one_version(dist: Path) -> None:
    names = {path.name for path in dist.iterdir()}
    for distribution in ("turnwire", "turnwire_sdk", "turnwire_client"):
        assert {f"{distribution}-{VERSION}.tar.gz", f"{distribution}-{VERSION}-py3-none-any.whl"} <= names
    assert f"turnwire-client-{VERSION}.tgz" in names
    release = dist / "goproxy" / "turnwire.dev" / "go" / "@v"
    assert (release / "list").read_text().split() == [f"v{VERSION}"]
    assert (release / f"v{VERSION}.mod").read_text() == (REPO / "clients" / "go" / "go.mod").read_text()


def test_every_artifact_carries_the_license(dist: Path) -> None:
    """The Apache-2.0 text the packages declare travels in each: the wheels' and sdists'
    ``LICENSE``, the npm tarball's, the Go module zip's (the packages' copies are links to the
    repository's, or, where npm skips links, a copy checked here)."""
    license_text = (REPO / "LICENSE").read_bytes()
    assert b"Apache License" in license_text and b"Version 2.0" in license_text
    for wheel in dist.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zipped:
            (name,) = [n for n in zipped.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
            assert zipped.read(name) == license_text, wheel.name
    for sdist in dist.glob("*.tar.gz"):
        with tarfile.open(sdist) as tarred:
            member = tarred.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
            assert member is not None and member.read() == license_text, sdist.name
    with tarfile.open(dist / f"turnwire-client-{VERSION}.tgz") as tarred:
        member = tarred.extractfile("package/LICENSE")
        assert member is not None and member.read() == license_text
    with zipfile.ZipFile(dist / "goproxy" / "turnwire.dev" / "go" / "@v" / f"v{VERSION}.zip") as zipped:
        assert zipped.read(f"turnwire.dev/go@v{VERSION}/LICENSE") == license_text


def test_python_dependencies_are_ranges_not_pins(dist: Path) -> None:
    for wheel in dist.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zipped:
            (metadata,) = [name for name in zipped.namelist() if name.endswith(".dist-info/METADATA")]
            requires = re.findall(r"^Requires-Dist: (.+)$", zipped.read(metadata).decode(), re.MULTILINE)
        runtime = [Requirement(line) for line in requires if "extra ==" not in line]
        assert runtime, wheel.name
        pinned = [str(r) for r in runtime if any(spec.operator in ("==", "===") for spec in r.specifier)]
        assert not pinned, f"{wheel.name} pins {pinned}"


def test_the_wheels_install_in_a_fresh_venv_and_turnwire_demo_calls_tools(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    shutil.copy(REPO / "constraints.txt", tmp_path / "constraints.txt")
    wheels = sorted(str(path) for path in dist.glob("*.whl"))
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--find-links", str(dist), "-c", "constraints.txt", *wheels], cwd=tmp_path)
    app = tmp_path / "app"
    app.mkdir()
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import turnwire, turnwire_client, turnwire_server as s; print(s.__file__)",
        ],
        cwd=app,
    )
    assert Path(where.strip()).is_relative_to(venv), where
    assert _run([str(venv / "bin" / "turnwire"), "--version"], cwd=app) == f"turnwire {VERSION}\n"
    output = _run([str(venv / "bin" / "turnwire"), "demo"], cwd=app, timeout=300)
    assert "get_weather" in output and "calculator" in output, output
    # The wheel ships the inspector page built (issue 39): `turnwire demo --inspect` serves it.
    page = Path(where.strip()).parent / "http" / "inspector_page"
    assert sorted(path.name for path in page.iterdir()) == ["index.html", "inspector.css", "inspector.js"]
    assert "turnwire demo --inspect" in output, output


TS_CHAT = """\
import { TurnwireClient, type TurnResult } from '@turnwire/client';
import { TurnwireWebClient } from '@turnwire/client/web';

async function weather(client: TurnwireClient | TurnwireWebClient, conversation: string): Promise<string> {
  const result: TurnResult = await client.chat(conversation, 'What is the weather in Paris?').collect();
  const calls = result.toolCalls.map((call) => `${call.toolName} ${JSON.stringify(call.output)}`);
  return `${result.status} ${calls.join(', ')}`;
}

const grpc = new TurnwireClient({ address: 'GRPC_ADDRESS' });
try {
  console.log('grpc', await weather(grpc, 'artifact-grpc'));
} finally {
  grpc.close();
}
console.log('web', await weather(new TurnwireWebClient({ baseUrl: 'HTTP_BASE' }), 'artifact-web'));
"""

TS_CONFIG = {
    "compilerOptions": {
        "target": "ES2022",
        "module": "NodeNext",
        "moduleResolution": "NodeNext",
        "lib": ["ES2022", "DOM"],
        "types": [],
        "strict": True,
        "skipLibCheck": True,
    },
    "files": ["chat.mts", "kit.mts"],
}

TS_KIT = """\
import { block, defineTool, hooks, serve } from '@turnwire/client/kit';

const double = defineTool<{ n: number }>({
  name: 'double',
  description: 'Doubles n.',
  inputSchema: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] },
  async *execute({ n }) {
    yield { doubling: n };
    return { doubled: n * 2 };
  },
});
const policy = hooks({
  beforeToolCall(_request, { input }) {
    return Number(input.n) < 0 ? block('n must not be negative') : undefined;
  },
});
const served = await serve({ hooks: policy, tools: [double], listen: 'KIT_ADDRESS' });
console.log(`listening on ${served.address}`);
"""


def test_the_npm_package_installs_in_a_scratch_project_and_chats_typed(
    dist: Path, tmp_path: Path, sidecar: SidecarProcess
) -> None:
    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    typescript = json.loads((REPO / "clients" / "node" / "package.json").read_text())["devDependencies"][
        "typescript"
    ]
    npm = ["npm", "install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"]
    _run([*npm, str(dist / f"turnwire-client-{VERSION}.tgz"), f"typescript@{typescript}"], cwd=project)
    source = TS_CHAT.replace("GRPC_ADDRESS", sidecar.target).replace("HTTP_BASE", http_base(sidecar))
    (project / "chat.mts").write_text(source)
    kit_port = free_port()
    kit_address = f"127.0.0.1:{kit_port}"
    (project / "kit.mts").write_text(TS_KIT.replace("KIT_ADDRESS", kit_address))
    (project / "tsconfig.json").write_text(json.dumps(TS_CONFIG))
    _run([str(project / "node_modules" / ".bin" / "tsc"), "-p", "."], cwd=project)
    output = _run(["node", "chat.mjs"], cwd=project, timeout=120)
    for door in ("grpc", "web"):
        assert re.search(rf"^{door} COMPLETED get_weather {{.*\"city\":\"Paris\"", output, re.MULTILINE), (
            output
        )

    # The kit: a typed hook server and tool host from the tarball, called by a real sidecar.
    wiring = {
        "middleware": [{"remote": {"address": kit_address, "name": "kit"}}],
        "tools": {"hosts": [{"name": "kit", "address": kit_address}]},
    }
    calls = [{"name": "double", "input": {"n": 21}}, {"name": "double", "input": {"n": -1}}]
    with _kit_program(["node", "kit.mjs"], project, kit_port) as kit:
        assert kit.stdout is not None
        assert kit.stdout.readline() == f"listening on {kit_address}\n".encode()
        outcomes = _kit_chat(tmp_path / "kit-sidecar", wiring, calls)
    assert outcomes == [({"doubled": 42}, ""), ("n must not be negative", "blocked")]

    # The browser entry bundles for browsers: esbuild fails on an import of a Node.js module.
    (project / "page.mjs").write_text("export { TurnwireWebClient } from '@turnwire/client/web';\n")
    esbuild = REPO / "node_modules" / ".bin" / "esbuild"
    _run(
        [str(esbuild), "page.mjs", "--bundle", "--platform=browser", "--format=esm", "--outfile=page.js"],
        cwd=project,
    )


@contextlib.contextmanager
def _kit_program(command: list[str], cwd: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Runs a kit program (a hook server and tool host that listens on 127.0.0.1:``port``), its
    stdout piped; yields it once the port accepts connections (failing the test if it exits
    first), and kills it at exit."""
    program = PortProcess(port)
    program.process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE)
    try:
        asyncio.run(wait_until(program.listening, what=f"{command[0]} listening on port {port}"))
        yield program.process
    finally:
        program.kill()


def _kit_chat(workdir: Path, wiring: dict[str, Any], calls: list[dict[str, Any]]) -> list[tuple[Any, str]]:
    """Runs a sidecar (in ``workdir``) configured with ``wiring``'s ``middleware`` and ``tools``
    (a running kit program as its hook server and tool host), and a chat whose scripted model makes
    ``calls`` in one step; per call, its result (a JSON value, or the text of a failed call) and
    the ``before_tool_call`` decision (``""``: none, ``"blocked"``, ``"substituted"``)."""
    config = {
        "providers": {"scripted": {"scripts": {"kit": [{"tool_calls": calls}, {"text": "Done."}]}}},
        "middleware": wiring["middleware"],
        "tools": {"demo": False, **wiring["tools"]},
    }
    sidecar = SidecarProcess(workdir, config)
    sidecar.start_blocking()
    try:
        result = asyncio.run(_chat(sidecar.target, "scripted:kit"))
    finally:
        sidecar.kill()
    assert result.ok, result.error
    return [
        (call.output if call.state == "output-available" else call.error_text, call.decision)
        for call in result.tool_calls
    ]


async def _chat(target: str, model: str) -> TurnResult:
    async with TurnwireClient(target) as client:
        return await collect(client.chat("artifact-kit", "double 21 and -1", model=model))


GO_CHAT = """\
package main

import (
	"context"
	"fmt"
	"log"

	"google.golang.org/grpc"

	turnwirev1 "turnwire.dev/go/gen/turnwire/v1"
	"turnwire.dev/go/turnwire"
)

func main() {
	ctx := context.Background()
	client, err := turnwire.Dial(ctx, "GRPC_ADDRESS", grpc.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	stream, err := client.Chat(ctx, &turnwirev1.ChatRequest{
		ConversationId: "artifact-go", Message: turnwire.UserText("What is the weather in Paris?")})
	if err != nil {
		log.Fatal(err)
	}
	for stream.Next() {
		if e, ok := stream.Event().GetEvent().(*turnwirev1.TurnEvent_ToolOutputAvailable); ok {
			output, _ := turnwire.ToolOutput(e.ToolOutputAvailable)
			fmt.Printf("tool %s %v\\n", e.ToolOutputAvailable.GetToolName(), output)
		}
	}
	if err := stream.Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("client", turnwire.Version, stream.End().GetStatus())
}
"""


GO_KIT_PAGE = REPO / "docs" / "api" / "kit-go.md"
#: Where the page's program serves, and where its sidecar config points.
GO_KIT_PAGE_ADDRESS = "127.0.0.1:7001"


def _go_kit_page(address: str) -> tuple[str, dict[str, Any]]:
    """docs/api/kit-go.md's program (its ``go`` block of ``package main``) and the sidecar config
    that lists it (its ``yaml`` block of ``middleware`` and ``tools``), as a user copies them, with
    the page's address replaced by ``address``."""
    page = GO_KIT_PAGE.read_text()
    program = re.search(r"^```go\n(package main\n.*?)^```", page, re.MULTILINE | re.DOTALL)
    config = re.search(r"^```yaml\n(middleware:.*?)^```", page, re.MULTILINE | re.DOTALL)
    assert program and config, f"{GO_KIT_PAGE} has no go program or yaml config block"
    assert f'"{GO_KIT_PAGE_ADDRESS}"' in program.group(1), f"{GO_KIT_PAGE}'s program moved"
    return program.group(1).replace(GO_KIT_PAGE_ADDRESS, address), yaml.safe_load(
        config.group(1).replace(GO_KIT_PAGE_ADDRESS, address)
    )


def _go_root() -> str:
    """The Go installation's directory (``go env GOROOT``)."""
    return subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()


def _go_requirements(go_mod: str) -> dict[str, str]:
    """Module path → version of every ``require`` of a ``go.mod``."""
    return dict(re.findall(r"^\s*(?:require\s+)?([a-z0-9.-]+\.[a-z]+/\S*)\s+(v\S+)", go_mod, re.MULTILINE))


def _vendor(app: Path, listing_gopath: Path, modules: dict[str, str], env: dict[str, str]) -> None:
    """Writes ``app/vendor`` (the packages ``app``'s programs import, by ``go list -deps`` over
    ``listing_gopath`` in GOPATH mode) and ``vendor/modules.txt``, and ``app/go.mod`` requiring
    each module at ``modules``' version (Go checks the two agree)."""
    listed = _run(
        ["go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}} {{.Dir}}{{end}}", "./..."],
        cwd=listing_gopath / "src" / "example.com" / "app",
        env={**env, "GO111MODULE": "off", "GOPATH": f"{listing_gopath}:{DEBIAN_GOPATH}"},
    )
    packages: dict[str, list[str]] = {}
    go_versions: dict[str, str] = {}
    for line in listed.splitlines():
        package, directory = line.split()
        if package.startswith("example.com/"):
            continue
        module = max((m for m in modules if package == m or package.startswith(m + "/")), key=len)
        packages.setdefault(module, []).append(package)
        root = Path(directory[: len(directory) - (len(package) - len(module))])
        declared = re.search(r"^go (\S+)", (root / "go.mod").read_text(), re.MULTILINE)
        go_versions[module] = f"; go {declared.group(1)}" if declared else ""
        target = app / "vendor" / package
        target.mkdir(parents=True, exist_ok=True)
        for file in Path(directory).iterdir():
            if file.is_file() and not file.name.endswith("_test.go"):
                shutil.copy(file, target / file.name)
    text = ""
    for module in sorted(packages):
        text += f"# {module} {modules[module]}\n## explicit{go_versions[module]}\n"
        text += "".join(f"{package}\n" for package in sorted(packages[module]))
    (app / "vendor" / "modules.txt").write_text(text)
    requires = "".join(f"\t{module} {modules[module]}\n" for module in sorted(packages))
    (app / "go.mod").write_text(f"module example.com/app\n\ngo 1.19\n\nrequire (\n{requires})\n")


def test_the_go_module_builds_in_a_scratch_module_and_chats_and_serves_a_kit(
    dist: Path, tmp_path: Path, sidecar: SidecarProcess
) -> None:
    if shutil.which("go") is None or not DEBIAN_GOPATH.is_dir():
        pytest.skip("Go and Debian's Go packages are not installed (make install-go)")
    release = dist / "goproxy" / "turnwire.dev" / "go" / "@v"
    version = f"v{VERSION}"
    # The module as a user's go command would unpack it from the proxy, and a GOPATH view of it
    # beside Debian's packages, to list the packages the program needs.
    listing = tmp_path / "gopath"
    with zipfile.ZipFile(release / f"{version}.zip") as zipped:
        zipped.extractall(tmp_path / "unpacked")
    (listing / "src" / "turnwire.dev").mkdir(parents=True)
    shutil.move(tmp_path / "unpacked" / f"turnwire.dev/go@{version}", listing / "src" / "turnwire.dev" / "go")
    kit_port = free_port()
    stock, wiring = _go_kit_page(f"127.0.0.1:{kit_port}")
    programs = {"chat": GO_CHAT.replace("GRPC_ADDRESS", sidecar.target), "stock": stock}
    app = tmp_path / "app"
    for root in (listing / "src" / "example.com" / "app", app):
        for name, source in programs.items():
            (root / name).mkdir(parents=True)
            (root / name / "main.go").write_text(source)
    modules = {**_go_requirements((release / f"{version}.mod").read_text()), "turnwire.dev/go": version}
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("GO")},
        "GOPROXY": "off",
        "GOFLAGS": "-mod=vendor",
        "GOPATH": str(tmp_path / "go-home"),
    }
    _vendor(app, listing, modules, env)
    # -trimpath, as a release build is made: no path of this machine (the module's, the Go
    # installation's) is written into the binaries.
    build = ["go", "build", "-trimpath", "-o", "bin/", "./..."]
    _run(build, cwd=app, env={**env, "GO111MODULE": "on"}, timeout=600)
    for program in programs:
        binary = (app / "bin" / program).read_bytes()
        for path in (str(tmp_path), str(REPO), _go_root()):
            assert path.encode() not in binary, f"bin/{program} holds the path {path}"
    output = _run([str(app / "bin" / "chat")], cwd=app, timeout=120)
    assert re.search(r"^tool get_weather map\[city:Paris ", output, re.MULTILINE), output
    assert f"client {VERSION} TURN_STATUS_COMPLETED" in output, output

    # The kit: the page's typed tool and policy hook, called by a real sidecar with the calls of
    # the page's own script (what a reader without an API key runs).
    calls = wiring["providers"]["scripted"]["scripts"]["stock"][0]["tool_calls"]
    assert calls == [
        {"name": "lookup_stock", "input": {"sku": "A-1"}},
        {"name": "lookup_stock", "input": {"sku": "internal-9"}},
    ]
    with _kit_program([str(app / "bin" / "stock")], app, kit_port):
        outcomes = _kit_chat(tmp_path / "kit-sidecar", wiring, calls)
    assert outcomes == [({"sku": "A-1", "units": 3}, ""), ("internal SKUs are not for customers", "blocked")]
