"""The commands the CLI prints as hints (``turnwire demo``'s closing hint, ``chat``'s request line,
the ``approve`` / ``continue`` / ``resume`` / ``history`` suggestions) can be run as they stand:
``turnwire`` when that name on the PATH is the program that ran, else the path it was started by
(``make demo`` starts ``.venv/bin/turnwire``, which a fresh shell does not find as ``turnwire``),
with the ``--target`` of a sidecar that is not the default one."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rich.console import Console

from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.cli.connection import command_name
from turnwire_server.cli.history import print_message
from turnwire_server.cli.live import TurnRenderer
from turnwire_server.cli.turns import _follow_up


def _program(directory: Path) -> Path:
    directory.mkdir(parents=True)
    program = directory / "turnwire"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return program


def test_the_hint_names_the_program_as_the_user_can_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _program(tmp_path / "app" / ".venv" / "bin")
    monkeypatch.chdir(tmp_path / "app")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "argv", [".venv/bin/turnwire", "demo"])
    assert command_name() == ".venv/bin/turnwire"  # not on the PATH: the path it was started by
    monkeypatch.setenv("PATH", str(venv.parent) + os.pathsep + str(tmp_path / "empty"))
    assert command_name() == "turnwire"  # on the PATH, the same program
    other = _program(tmp_path / "elsewhere")
    monkeypatch.setenv("PATH", str(other.parent))
    assert command_name() == ".venv/bin/turnwire"  # another turnwire on the PATH
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/turnwire_server/__main__.py", "demo"])
    assert command_name() == "turnwire"  # python -m turnwire_server


async def test_every_command_the_cli_suggests_runs_as_it_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started as ``.venv/bin/turnwire`` (no ``turnwire`` on the PATH) against a sidecar at another
    address: every command a hint names is that program with that ``--target``. Before, ``chat``
    printed `` `turnwire cancel …` `` (command not found in a fresh shell) beside the demo's
    `` `.venv/bin/turnwire demo --inspect` ``, and ``approve`` / ``continue`` hints left out the
    ``--target``, so they would have reached another sidecar."""
    _program(tmp_path / "app" / ".venv" / "bin")
    monkeypatch.chdir(tmp_path / "app")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "argv", [".venv/bin/turnwire", "chat"])
    where = " --target 127.0.0.1:7"
    program = ".venv/bin/turnwire"

    out, err = io.StringIO(), io.StringIO()
    renderer = TurnRenderer(
        Console(file=out, width=300),
        "cli-1",
        err_console=Console(file=err, width=300),
        conversation_id="c1",
        target_flag=where,
    )
    approval = event_pb2.ToolApprovalRequest(tool_call_id="k1", tool_name="refund")

    async def events() -> AsyncIterator[event_pb2.TurnEvent]:
        yield event_pb2.TurnEvent(tool_approval_request=approval)

    async for _ in renderer.tee(events()):
        pass
    renderer.end_line()
    assert f"`{program} cancel cli-1{where}`" in err.getvalue()
    assert f"`{program} approve c1 k1{where}`" in out.getvalue()

    shown = io.StringIO()
    message = message_pb2.Message(
        id="m1",
        role=message_pb2.ROLE_ASSISTANT,
        parts=[
            message_pb2.Part(
                tool_call=message_pb2.ToolCallPart(tool_call_id="k1", tool_name="refund", state=state)
            )
            for state in (
                message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED,
                message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED,
            )
        ],
    )
    print_message(Console(file=shown, width=300), message, "c1", where)
    assert f"`{program} approve c1 k1{where}`" in shown.getvalue()
    assert f"`{program} continue c1{where}`" in shown.getvalue()

    lost = _follow_up("cli-1", "c1", "127.0.0.1:7", stored=False)
    assert f"`{program} resume cli-1{where}`" in lost and f"`{program} history c1{where}`" in lost
