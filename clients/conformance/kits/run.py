"""Kit conformance runner: every case of clients/conformance/kits/cases against a kit's fixture.

Usage: ``python clients/conformance/kits/run.py --kit python|node|go [CASE_NAME ...]``.
For each config (``configs/``), starts the kit's fixture (SPEC.md §1; the command from
:data:`FIXTURES`, or from ``TURNWIRE_KIT_FIXTURE_<KIT>``), then a real ``turnwire serve`` that uses
it as its remote hook server and tool host, and runs the cases of that config through
``turnwire_client.TurnwireClient``, with the client suite's steps and matching rules
(clients/conformance/python/run.py) plus the fixture, journal and model-request steps of SPEC.md §5.
Prints ``ok   CASE [CONFIG]`` or ``FAIL CASE [CONFIG]: …`` per case, then ``N passed, M failed``;
exits 1 when a case failed or none ran, 2 when the fixture is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import hooks_pb2, hooks_pb2_grpc, tools_pb2, tools_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
SUITE = Path(os.environ.get("TURNWIRE_KIT_CONFORMANCE_DIR") or Path(__file__).resolve().parent)
READY = re.compile(r"turnwire-kit-fixture listening on 127\.0\.0\.1:(\d+)")
FIXTURE_START_TIMEOUT = 60.0  # seconds: a Go fixture may build first on a loaded machine
CASE_TIMEOUT = 60.0  # seconds per case

FIXTURES: dict[str, list[str]] = {
    "python": [str(REPO / ".venv" / "bin" / "python"), "clients/conformance/kits/python/fixture.py"],
    "node": ["node", "clients/conformance/kits/node/fixture.mjs"],
    "go": ["bash", "clients/conformance/kits/go/fixture.sh"],
}
"""Each kit's fixture command (run from the repository root; ``--port 0 --journal PATH`` is
appended). ``TURNWIRE_KIT_FIXTURE_PYTHON`` / ``_NODE`` / ``_GO`` replace one (a command line, split
as a shell does)."""


def _client_runner() -> Any:
    """The client suite's Python runner, whose steps and matching rules the kit suite shares."""
    path = REPO / "clients" / "conformance" / "python" / "run.py"
    spec = importlib.util.spec_from_file_location("turnwire_client_conformance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


client_suite = _client_runner()
CaseFailure = client_suite.CaseFailure
match = client_suite.match


def fixture_command(kit: str) -> list[str]:
    """The kit's fixture command line (without the flags the runner adds)."""
    override = os.environ.get(f"TURNWIRE_KIT_FIXTURE_{kit.upper()}")
    return shlex.split(override) if override else FIXTURES[kit]


class Fixture:
    """A kit's fixture process (SPEC.md §1), in its own process group, with its journal."""

    def __init__(self, command: list[str], workdir: Path) -> None:
        self.command = command
        self.journal = workdir / "journal.jsonl"
        self.stderr_path = workdir / "fixture.stderr"
        self.process: asyncio.subprocess.Process | None = None
        self.address = ""
        self._drain: asyncio.Task[None] | None = None

    def stderr_tail(self) -> str:
        """The last 3000 characters of the fixture's stderr."""
        return self.stderr_path.read_text(errors="replace")[-3000:] if self.stderr_path.exists() else ""

    async def start(self) -> None:
        """Start it and wait for its ready line; raise RuntimeError when it exits or stays silent."""
        with self.stderr_path.open("wb") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                *self.command,
                "--port",
                "0",
                "--journal",
                str(self.journal),
                cwd=REPO,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,  # a wrapper script's children get the SIGTERM too
            )
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), FIXTURE_START_TIMEOUT)
        except TimeoutError:
            raise RuntimeError(
                f"no ready line after {FIXTURE_START_TIMEOUT:g} s:\n{self.stderr_tail()}"
            ) from None
        found = READY.fullmatch(line.decode(errors="replace").rstrip("\r\n"))
        if found is None:
            raise RuntimeError(f"expected the ready line, got {line!r}:\n{self.stderr_tail()}")
        self.address = f"127.0.0.1:{found.group(1)}"
        self._drain = asyncio.create_task(self._discard(self.process.stdout))  # later output

    @staticmethod
    async def _discard(stream: asyncio.StreamReader) -> None:
        while await stream.read(65536):
            pass

    async def stop(self) -> None:
        """SIGTERM to its process group, wait (SIGKILL after 10 s)."""
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()
        if self._drain is not None:
            self._drain.cancel()

    def records(self) -> list[dict[str, Any]]:
        """The journal's records so far."""
        return _lines(self.journal)


def _merge(base: Any, over: Any) -> Any:
    """``over`` on ``base``: objects merged member by member, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{key: _merge(base.get(key), value) for key, value in over.items()}}
    return over


def _substitute(value: Any, address: str) -> Any:
    if isinstance(value, str):
        return value.replace("${FIXTURE}", address)
    if isinstance(value, dict):
        return {key: _substitute(item, address) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, address) for item in value]
    return value


def write_config(name: str, fixture: Fixture, workdir: Path) -> tuple[Path, Path]:
    """``configs/common.json`` under ``configs/NAME.json``, the fixture's address in, the scripted
    model recording its requests; the config's path and the record's."""
    common = json.loads((SUITE / "configs" / "common.json").read_text())
    config = _merge(common, json.loads((SUITE / "configs" / f"{name}.json").read_text()))
    config = _substitute(config, fixture.address)
    record = workdir / "model-requests.jsonl"
    config["providers"]["scripted"]["record_requests"] = str(record)
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(config))
    return path, record


def _lines(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's records (a line still being written, without its newline, left out)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


class KitSteps:
    """The kit suite's own steps (SPEC.md §5): ``fixture``, ``journal``, ``modelRequests``."""

    def __init__(self, fixture: Fixture, model_requests: Path) -> None:
        self.fixture = fixture
        self.model_requests = model_requests

    async def __call__(self, step: dict[str, Any]) -> list[str] | None:
        if "fixture" in step:
            return await self._call_fixture(step["fixture"], step.get("request", {}), step.get("expect", {}))
        if "journal" in step:
            wanted = step["journal"]
            return await self._eventually(
                lambda: [r for r in self.fixture.records() if all(r.get(k) == v for k, v in wanted.items())],
                step["expect"],
                "journal",
            )
        if "modelRequests" in step:
            script = step["modelRequests"]
            return await self._eventually(
                lambda: [
                    r for r in _lines(self.model_requests) if r.get("model") in (script, f"scripted:{script}")
                ],
                step["expect"],
                "modelRequests",
            )
        return None

    async def _call_fixture(self, rpc: str, request: dict[str, Any], expect: dict[str, Any]) -> list[str]:
        """Call ``rpc`` on the fixture with ``request`` (proto JSON); match its response against
        ``expect.response``, or the status it failed with (``{code: NAME, message}``) against
        ``expect.failure``. ``HookSession`` sends one request and reads one response."""
        async with grpc.aio.insecure_channel(self.fixture.address) as channel:
            hooks: Any = hooks_pb2_grpc.TurnHooksServiceStub(channel)
            try:
                if rpc == "GetHookSubscriptions":
                    response = await hooks.GetHookSubscriptions(
                        hooks_pb2.GetHookSubscriptionsRequest(), timeout=10
                    )
                elif rpc == "ListTools":
                    tools: Any = tools_pb2_grpc.ToolExecutorServiceStub(channel)
                    response = await tools.ListTools(tools_pb2.ListToolsRequest(), timeout=10)
                elif rpc == "BeforeTurn":
                    message = json_format.ParseDict(request, hooks_pb2.BeforeTurnRequest())
                    response = await hooks.BeforeTurn(message, timeout=10)
                else:  # HookSession: one request, its first response, then the stream is closed
                    session = hooks.HookSession(timeout=10)
                    await session.write(json_format.ParseDict(request, hooks_pb2.HookSessionRequest()))
                    response = await session.read()
                    await session.done_writing()
                    session.cancel()
            except grpc.aio.AioRpcError as error:
                failed = {"code": error.code().name, "message": error.details()}
                if "failure" not in expect:
                    return [f"{rpc} failed: {failed}"]
                return match(expect["failure"], failed, "failure")
        if "failure" in expect:
            return [f"{rpc} answered {client_suite.to_json(response)} where it should have failed"]
        return match(expect.get("response", {}), client_suite.to_json(response), "response")

    @staticmethod
    async def _eventually(read: Any, pattern: Any, what: str) -> list[str]:
        """Match ``read()`` until it holds, for up to the client suite's WAIT_TIMEOUT."""
        deadline = time.monotonic() + client_suite.WAIT_TIMEOUT
        while True:
            records = read()
            problems = match(pattern, records, what)
            if not problems:
                return []
            if time.monotonic() > deadline:
                return [*problems, f"(the records: {json.dumps(records)[:2000]})"]
            await asyncio.sleep(0.05)  # the poll interval


def load_cases(names: list[str]) -> list[dict[str, Any]]:
    """The case files in name order (only ``names`` when given)."""
    cases = [json.loads(path.read_text()) for path in sorted((SUITE / "cases").glob("*.json"))]
    return [case for case in cases if not names or case["name"] in names]


async def run_config(kit: str, config: str, cases: list[dict[str, Any]]) -> tuple[int, int]:
    """One fixture and one sidecar for ``config``; its cases; ``(passed, failed)``."""
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix=f"turnwire-kit-{kit}-") as name:
        workdir = Path(name)
        fixture = Fixture(fixture_command(kit), workdir)
        sidecar = None
        try:
            await fixture.start()
            config_path, model_requests = write_config(config, fixture, workdir)
            sidecar = client_suite.Sidecar(config_path)
            await sidecar.wait_serving()
            steps = KitSteps(fixture, model_requests)
            async with TurnwireClient(sidecar.address) as client:
                for case in cases:
                    try:
                        await asyncio.wait_for(client_suite.run_case(client, case, steps), CASE_TIMEOUT)
                    except (CaseFailure, TimeoutError, TurnwireError) as failure:
                        failed += 1
                        print(f"FAIL {case['name']} [{config}]: {failure or 'timed out'}", flush=True)
                    else:
                        passed += 1
                        print(f"ok   {case['name']} [{config}]", flush=True)
        except RuntimeError as error:  # the fixture or the sidecar did not start
            failed += len(cases)
            print(f"FAIL [{config}]: {error}\n{fixture.stderr_tail()}", flush=True)
        finally:
            if sidecar is not None:
                sidecar.stop()
            await fixture.stop()
    return passed, failed


async def main(kit: str, names: list[str]) -> int:
    """Run the cases; the process's exit code."""
    cases = load_cases(names)
    passed = failed = 0
    for config in dict.fromkeys(config for case in cases for config in case["configs"]):
        ran = await run_config(kit, config, [case for case in cases if config in case["configs"]])
        passed, failed = passed + ran[0], failed + ran[1]
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not cases else 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run the kit conformance suite against one kit's fixture.")
    parser.add_argument("--kit", required=True, choices=sorted(FIXTURES))
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = _arguments()
    command = fixture_command(arguments.kit)
    script = next((part for part in command[1:] if part.startswith("clients/")), None)
    if script is not None and not (REPO / script).exists():
        print(f"no {arguments.kit} fixture: {script} is missing (SPEC.md §1)", file=sys.stderr)
        sys.exit(2)
    sys.exit(asyncio.run(main(arguments.kit, arguments.cases)))
