"""``turnwire chat``'s message: ``-`` reads it from standard input; an empty one is refused before
anything is sent (a fresh-user trial: ``turnwire chat z3 ""`` stored an empty message and ran a
turn on it)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator

import pytest
from support.sidecar import CommandResult, SidecarProcess, running_sidecar

from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import message_pb2


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("cli-input"), {}) as process:
        yield process


async def chat_with_stdin(stdin: str, *args: str) -> CommandResult:
    """``turnwire chat ARGS`` with ``stdin`` on its standard input, run to its end."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TURNWIRE_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnwire_server",
        "chat",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout=120)
    assert process.returncode is not None
    return CommandResult(process.returncode, out.decode(), err.decode())


async def test_a_dash_reads_the_message_from_standard_input(sidecar: SidecarProcess) -> None:
    text = "line one\nline two: what time is it?\n"
    run = await chat_with_stdin(text, "cli-stdin", "-", "--target", sidecar.target)
    assert run.code == 0, run.stderr
    async with TurnwireClient(sidecar.target) as client:
        stored = await client.get_conversation("cli-stdin")
    first = stored.messages[0]
    assert first.role == message_pb2.ROLE_USER
    assert [p.text.text for p in first.parts] == [text]


@pytest.mark.parametrize(("argument", "stdin"), [("", ""), ("   ", ""), ("-", " \n")])
async def test_an_empty_message_is_refused_and_nothing_is_stored(
    sidecar: SidecarProcess, argument: str, stdin: str
) -> None:
    run = await chat_with_stdin(stdin, "cli-empty", argument, "--target", sidecar.target)
    assert run.code == 2
    assert "the message is empty; give some text (or - to read it from standard input)" in run.stderr
    async with TurnwireClient(sidecar.target) as client:
        with pytest.raises(TurnwireError) as raised:
            await client.get_conversation("cli-empty")
    assert raised.value.reason == "CONVERSATION_NOT_FOUND"
