"""``turnwire chat`` / ``continue`` / ``cancel`` / ``conversations`` as commands against a real sidecar.

Ctrl-C is a real SIGINT to the ``turnwire chat`` process mid-reply: the command says the turn was
aborted, exits 130, and the sidecar has stored the partial reply (docs/semantics.md §5).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.endless import is_prefix_of_repeats
from support.hooks import pythonpath_env
from support.sidecar import SidecarFactory, SidecarProcess, run_turnwire, running_sidecar, spawn_turnwire
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2

ENDLESS = "".join(f"w{i} " for i in range(40))

CONFIG = {
    "tools": {"python": ["support.durable_tools:countdown"], "require_approval": ["get_current_time"]},
    "middleware": [{"path": "support.hooks:BlockToolsFromBody"}],
    "providers": {
        "scripted": {
            "scripts": {
                # "w0 … w39 " again and again, a word every 50 ms, until the turn is cancelled: a
                # Ctrl-C or a `turnwire cancel` always lands mid-reply, however slow the machine.
                "endless": [{"text": ENDLESS, "delay_ms": 50, "until_cancelled": True}],
                # Two seconds of words: a sidecar killed mid-reply is killed mid-turn.
                "slow": [{"text": ENDLESS, "chunk_size": 4, "delay_ms": 50}],
                # Nothing for 60 s: a Ctrl-C lands before the first token.
                "silent": [{"text": "late", "delay_ms": 60_000}],
                "answer": [{"text": "The answer."}],
                "two-calcs": [
                    {
                        "tool_calls": [
                            {"name": "calculator", "input": {"expression": "2 + 3"}},
                            {"name": "get_weather", "input": {"city": "Oslo"}},
                        ]
                    },
                    {"text": "Done."},
                ],
                "streaming-tool": [
                    {"tool_calls": [{"name": "countdown", "input": {"start": 2}}]},
                    {"text": "Done counting."},
                ],
            }
        }
    },
}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("cli"), CONFIG, pythonpath_env()) as process:
        yield process


async def test_ctrl_c_aborts_the_turn_and_says_so(sidecar: SidecarProcess) -> None:
    chat = await spawn_turnwire(
        "chat",
        "cli-ctrl-c",
        "Tell me a long story.",
        "--target",
        sidecar.target,
        "--model",
        "scripted:endless",
    )
    assert chat.stdout is not None
    first = await asyncio.wait_for(chat.stdout.read(2), timeout=30)  # the reply has begun
    assert first.startswith(b"w")
    chat.send_signal(signal.SIGINT)
    rest, err = await asyncio.wait_for(chat.communicate(), timeout=30)
    output = (first + rest).decode()
    assert chat.returncode == 130, (output, err.decode())
    assert "ABORTED by Ctrl-C · request cli-" in output
    assert "Traceback" not in err.decode()

    async with TurnwireClient(sidecar.target) as client:

        async def partial_stored() -> list[str] | None:
            """The stored reply's texts once the turn ended with it partial (not a checkpoint)."""
            conversation = await client.get_conversation("cli-ctrl-c")
            if not conversation.partial_replies:
                return None
            replies = [m for m in conversation.messages if m.role == message_pb2.ROLE_ASSISTANT]
            return [p.text.text for p in replies[-1].parts if p.HasField("text")] if replies else None

        words = await wait_until(partial_stored, timeout=15)
    # The reply streamed until the Ctrl-C cut it: what is stored is a start of the endless text.
    assert words and words[0].startswith("w0 ")
    assert is_prefix_of_repeats(words[0], ENDLESS), words

    shown = await run_turnwire("history", "cli-ctrl-c", "--target", sidecar.target)
    assert shown.code == 0, shown
    marks = [line for line in shown.stdout.splitlines() if line.startswith("(partial: turn cli-")]
    assert len(marks) == 1 and marks[0].endswith(" ended ABORTED: CANCELLED (caller_left))"), shown.stdout
    async with TurnwireClient(sidecar.target) as client:
        conversation = await client.get_conversation("cli-ctrl-c")
    (reply,) = conversation.partial_replies
    assert reply.message_id == conversation.messages[-1].id
    assert reply.status == event_pb2.TURN_STATUS_ABORTED


async def test_ctrl_c_before_the_first_token_says_no_reply_was_stored(sidecar: SidecarProcess) -> None:
    """Trial 3: a Ctrl-C after the turn started but before the model's first token said "the
    partial reply is stored as aborted", yet no reply is stored (docs/semantics.md §11). Issue 16:
    `history` then showed the user message alone; GetConversation now lists the turn among
    `turns_without_reply` and `history` marks it after that message."""
    chat = await spawn_turnwire(
        "chat", "cli-ctrl-c-early", "hi", "--target", sidecar.target, "--model", "scripted:silent"
    )
    assert chat.stderr is not None
    accepted = (await asyncio.wait_for(chat.stderr.readline(), timeout=30)).decode()  # TurnStart came
    request_id = accepted.split()[1]
    chat.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(chat.communicate(), timeout=30)
    assert chat.returncode == 130, (out, err)
    assert out.decode().splitlines()[-1] == (
        f"ABORTED by Ctrl-C · request {request_id}: your message is stored; no reply had arrived, "
        "so none was stored"
    )
    async with TurnwireClient(sidecar.target) as client:

        async def settled() -> bool:
            return not await client.cancel_chat(request_id)  # the cancelled turn has ended

        await wait_until(settled, timeout=15)
        conversation = await client.get_conversation("cli-ctrl-c-early")
    assert [m.role for m in conversation.messages] == [message_pb2.ROLE_USER]
    assert not conversation.partial_replies
    (turn,) = conversation.turns_without_reply
    assert (turn.request_id, turn.status) == (request_id, event_pb2.TURN_STATUS_ABORTED)

    shown = await run_turnwire("history", "cli-ctrl-c-early", "--target", sidecar.target)
    assert shown.code == 0, shown
    lines = shown.stdout.splitlines()
    mark = f"(turn {request_id} ended ABORTED before any reply was stored: CANCELLED (caller_left))"
    assert lines[-2:] == ["hi", mark], shown.stdout  # after the user message, plain when piped

    # Trial 4: `continue` then answers the waiting message (there was no reply to continue),
    # without storing it twice.
    answered = await run_turnwire(
        "continue", "cli-ctrl-c-early", "--target", sidecar.target, "--model", "scripted:answer"
    )
    assert answered.code == 0, answered
    assert "The answer." in answered.stdout and "COMPLETED" in answered.stdout, answered
    assert "SKIPPED" not in answered.stdout + answered.stderr
    async with TurnwireClient(sidecar.target) as client:
        conversation = await client.get_conversation("cli-ctrl-c-early")
    assert [m.role for m in conversation.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert conversation.messages[-1].parts[-1].text.text == "The answer."


async def test_a_streaming_tool_shows_its_preliminary_results(sidecar: SidecarProcess) -> None:
    run = await run_turnwire(
        "chat", "cli-prelim", "count", "--target", sidecar.target, "--model", "scripted:streaming-tool"
    )
    assert run.code == 0, run
    lines = run.stdout.splitlines()
    prelim = [line for line in lines if line.startswith("… countdown: ")]
    assert prelim == [
        '… countdown: {"left": 2} (preliminary)',
        '… countdown: {"left": 1} (preliminary)',
        '… countdown: "liftoff" (preliminary)',
    ], lines
    # The last preliminary value is the result: said once, not printed again as the final.
    final = [i for i, line in enumerate(lines) if line.startswith("← countdown: ")]
    assert [lines[i] for i in final] == ["← countdown: final result as above"], lines
    assert lines.index(prelim[-1]) < final[0]
    assert run.stdout.count("liftoff") == 1
    assert "\x1b" not in run.stdout  # piped: no spinner, no control codes


async def test_piped_chat_shows_its_request_id_for_cancel(sidecar: SidecarProcess) -> None:
    """Piped, there is no spinner to show the request id: it goes to stderr, stdout stays the
    reply, and that id cancels the turn. The cut stream's output was never counted by the model:
    the status line says so instead of "out 0"."""
    chat = await spawn_turnwire(
        "chat", "cli-piped-id", "story", "--target", sidecar.target, "--model", "scripted:endless"
    )
    assert chat.stdout is not None and chat.stderr is not None
    first = (await asyncio.wait_for(chat.stderr.readline(), timeout=30)).decode()
    assert first.startswith("request cli-") and "`turnwire cancel cli-" in first, first
    request_id = first.split()[1]
    assert await asyncio.wait_for(chat.stdout.read(2), timeout=30) == b"w0"  # the reply has begun
    cancel = await run_turnwire("cancel", request_id, "--target", sidecar.target)
    assert cancel.code == 0, cancel
    out, err = await asyncio.wait_for(chat.communicate(), timeout=30)
    assert chat.returncode == 1, (out, err)
    status = out.decode().splitlines()[-1]
    # The TurnEnd says who cancelled: a CancelChat (turnwire cancel), not this client.
    assert status.startswith(
        "ABORTED [CANCELLED]: the turn was cancelled: `turnwire cancel` or CancelSubmission;"
        " its partial reply is stored"
    ), status
    assert "out 0" not in status and "out not reported" in status, status
    assert request_id not in out.decode()  # stdout is the reply and its status line only


async def test_connection_options_go_before_or_after_the_command(sidecar: SidecarProcess) -> None:
    before = await run_turnwire("--target", sidecar.target, "chat", "cli-group-target", "hi")
    assert before.code == 0, before
    assert before.stdout.splitlines()[-1].startswith("COMPLETED")
    # After the command wins over before it; before it wins over the variable.
    after_wins = await run_turnwire(
        "-t", "127.0.0.1:1", "history", "cli-group-target", "--target", sidecar.target
    )
    assert after_wins.code == 0, after_wins
    over_env = await run_turnwire(
        "--target", sidecar.target, "conversations", env={"TURNWIRE_TARGET": "127.0.0.1:1"}
    )
    assert over_env.code == 0 and "cli-group-target" in over_env.stdout, over_env
    # Not silently ignored before a command that connects to no sidecar.
    refused = await run_turnwire("--target", sidecar.target, "config", "show")
    assert refused.code == 2, refused
    assert "--target: connection options are for the commands that talk to a sidecar" in refused.stderr


async def test_cli_errors_name_commands_not_rpcs(sidecar: SidecarProcess) -> None:
    run = await run_turnwire("continue", "cli-never-started", "--target", sidecar.target)
    assert run.code == 2, run
    # Errors go to stderr, with no request line before them (the turn was never accepted).
    assert run.stdout == "" and run.stderr.startswith("NOT_FOUND"), run
    assert "start it with `turnwire chat`" in run.stderr, run
    assert "SaveMessages" not in run.stderr and "ContinueLastTurn" not in run.stderr


async def test_continue_cancel_and_conversations_commands(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        await collect(client.chat("cli-listed", "hello"))
    listed = await run_turnwire("conversations", "--target", sidecar.target)
    assert listed.code == 0, listed
    assert any(line.startswith("cli-listed · 2 messages · updated ") for line in listed.stdout.splitlines())

    continued = await run_turnwire("continue", "cli-listed", "--target", sidecar.target)
    assert continued.code == 0, continued
    assert continued.stdout.splitlines()[-1].startswith("COMPLETED")
    complete = await run_turnwire("history", "cli-listed", "--target", sidecar.target)
    assert "(partial" not in complete.stdout

    # A turn that runs until cancelled, started by the client, cancelled by the command with its
    # request id.
    async with TurnwireClient(sidecar.target) as client:
        stream = client.chat("cli-cancel", "story", request_id="cli-cancel-me", model="scripted:endless")
        started = asyncio.ensure_future(collect(stream))
        cancel = None

        async def cancelled() -> bool:
            nonlocal cancel
            cancel = await run_turnwire("cancel", "cli-cancel-me", "--target", sidecar.target)
            return cancel.code == 0

        await wait_until(cancelled, timeout=30)
        result = await started
    assert cancel is not None and "cancelled cli-cancel-me" in cancel.stdout
    assert result.status_name == "ABORTED"
    again = await run_turnwire("cancel", "cli-cancel-me", "--target", sidecar.target)
    assert again.code == 1 and "no running or queued turn cli-cancel-me" in again.stderr, again
    assert again.stdout == ""


async def test_resume_follows_a_turn_by_its_request_id(sidecar: SidecarProcess) -> None:
    """What a LEASE_LOST end (or any broken stream) tells a CLI user to do: follow the turn."""
    async with TurnwireClient(sidecar.target) as client:
        done = await collect(
            client.chat("cli-resumed", "go", request_id="cli-resume-me", model="scripted:two-calcs")
        )
    assert done.ok
    whole = await run_turnwire("resume", "cli-resume-me", "--target", sidecar.target)
    assert whole.code == 0, whole
    assert "calculator" in whole.stdout and "Done." in whole.stdout
    assert whole.stdout.splitlines()[-1].startswith("COMPLETED · 2 steps")
    assert "cancels it while it runs" not in whole.stderr, whole  # it ended: nothing to cancel
    last = done.events[-1].sequence_number
    tail = await run_turnwire("resume", "cli-resume-me", "--after", str(last - 1), "--target", sidecar.target)
    assert tail.code == 0, tail
    assert "calculator" not in tail.stdout and tail.stdout.splitlines()[-1].startswith("COMPLETED")
    unknown = await run_turnwire("resume", "cli-nobody", "--target", sidecar.target)
    assert unknown.code == 2, unknown
    assert "cli-nobody" in unknown.stderr


async def test_a_chat_that_lost_its_sidecar_says_how_to_follow_the_turn_and_that_works(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """Fresh-user trial: with the sidecar killed mid-turn, `turnwire chat` said only "lost the
    connection to the sidecar at … (Stream removed (Socket closed))", though the turn was stored
    and recovered when the sidecar started again. It now names the turn and the command that
    follows it; that command, against the restarted sidecar, shows the recovered turn to its end."""
    first = await sidecar_factory(CONFIG, pythonpath_env(), workdir=tmp_path).start()
    chat = await spawn_turnwire(
        "chat", "cli-lost", "Count slowly.", "--target", first.target, "--model", "scripted:slow"
    )
    assert chat.stdout is not None
    begun = await asyncio.wait_for(chat.stdout.read(2), timeout=30)  # the reply has begun
    assert begun.startswith(b"w"), begun
    first.kill()
    rest, err = await asyncio.wait_for(chat.communicate(), timeout=30)
    errors = err.decode()
    assert chat.returncode == 3, ((begun + rest).decode(), errors)
    lines = errors.splitlines()
    assert f"lost the connection to the sidecar at {first.target}" in lines, errors
    said = [
        re.fullmatch(
            r"turn (cli-[0-9a-f]+) is stored: `(turnwire resume \1 --target \S+)` follows it, "
            r"or shows how it ended, once the sidecar answers again",
            line,
        )
        for line in lines
    ]
    (follow,) = [match for match in said if match]

    second = sidecar_factory(CONFIG, pythonpath_env(), workdir=tmp_path)
    second.port = first.port  # started again where it was: the command runs as said
    await second.start()
    resumed = await run_turnwire(*shlex.split(follow.group(2))[1:])
    assert resumed.code == 0, (resumed, second.log_text())
    assert resumed.stdout.splitlines()[-1].startswith("COMPLETED"), resumed
    assert "w39" in resumed.stdout, resumed  # the reply, recovered to its end


def test_the_help_flag_has_a_short_form() -> None:
    import subprocess

    run = subprocess.run(
        [sys.executable, "-m", "turnwire_server", "serve", "-h"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0
    assert "TURNWIRE_CONFIG" in run.stdout and "127.0.0.1:50051" in run.stdout


def test_top_level_help_names_the_variables_of_the_connection_options() -> None:
    """Trial 3: each command's -h named TURNWIRE_TARGET and TURNWIRE_TOKEN, `turnwire -h` did not."""
    import subprocess

    run = subprocess.run(
        [sys.executable, "-m", "turnwire_server", "-h"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0
    shown = " ".join(run.stdout.split())  # help text wraps where the terminal width says
    assert (
        "--target <str> Sidecar address HOST:PORT, for the client commands. [env var: TURNWIRE_TARGET]"
        in shown
    )
    assert "--token <str> Bearer token, for the client commands. [env var: TURNWIRE_TOKEN]" in shown
    assert "[env var: TURNWIRE_TLS_CA]" in shown


def test_top_level_help_lists_each_command_in_one_whole_line() -> None:
    """``turnwire -h``: one summary sentence per command, none cut off with "..." or broken mid-
    sentence, and flags without a ``<bool>`` type label (a fresh-user trial tripped on all three)."""
    import subprocess

    run = subprocess.run(
        [sys.executable, "-m", "turnwire_server", "-h"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0
    commands = run.stdout.split("Commands:\n", 1)[1].splitlines()
    names = [line.split()[0] for line in commands if line.strip()]
    assert names == [
        "serve",
        "migrate",
        "chat",
        "continue",
        "approve",
        "cancel",
        "resume",
        "conversations",
        "history",
        "fork",
        "health",
        "demo",
        "config",
        "webhooks",
        "schedule",
    ]
    for line in commands:
        assert line.startswith("  ") and not line.startswith("   "), f"a wrapped summary: {line!r}"
        assert line.rstrip().endswith(".") and not line.rstrip().endswith("..."), f"cut off: {line!r}"
    assert "<bool>" not in run.stdout


async def test_blocked_and_substituted_results_are_marked(sidecar: SidecarProcess) -> None:
    body = '{"block_tools": ["calculator"], "substitute_tools": ["get_weather"]}'
    run = await run_turnwire(
        "chat",
        "cli-blocked",
        "calc",
        "--target",
        sidecar.target,
        "--model",
        "scripted:two-calcs",
        "--body",
        body,
    )
    assert run.code == 0, run
    lines = run.stdout.splitlines()
    assert "← calculator: blocked by a hook: blocked by the test policy" in lines, lines
    assert '← get_weather: {"substituted": true} (substituted by a hook; the tool did not run)' in lines, (
        lines
    )

    shown = await run_turnwire("history", "cli-blocked", "--target", sidecar.target)
    assert "← calculator: blocked by a hook: blocked by the test policy" in shown.stdout.splitlines()
    async with TurnwireClient(sidecar.target) as client:
        conversation = await client.get_conversation("cli-blocked")
    calls = {
        p.tool_call.tool_name: p.tool_call for p in conversation.messages[-1].parts if p.HasField("tool_call")
    }
    assert calls["calculator"].decision == message_pb2.TOOL_CALL_DECISION_BLOCKED
    assert calls["get_weather"].decision == message_pb2.TOOL_CALL_DECISION_SUBSTITUTED


async def test_an_unknown_model_is_said_once(sidecar: SidecarProcess) -> None:
    run = await run_turnwire(
        "chat", "cli-unknown-model", "hi", "--target", sidecar.target, "--model", "fak:x"
    )
    assert run.code == 2, run
    assert run.stdout == "", run
    lines = run.stderr.splitlines()  # the error first: no request line for a turn never accepted
    assert lines[0].startswith("INVALID_ARGUMENT [UNKNOWN_MODEL]: model 'fak:x' names provider 'fak'")
    assert sum("names provider 'fak'" in line for line in lines) == 1, lines


async def test_history_piped_keeps_each_header_on_one_line(sidecar: SidecarProcess) -> None:
    """Piped output is 80 columns to rich; a header longer than that stayed whole in
    ``conversations`` but was broken in ``history`` (a fresh-user trial)."""
    conversation = "a-conversation-id-long-enough-to-push-the-header-past-eighty-columns"
    chat = await run_turnwire("chat", conversation, "hi", "--target", sidecar.target)
    assert chat.code == 0, chat
    shown = await run_turnwire("history", conversation, "--target", sidecar.target)
    assert shown.code == 0, shown
    header = shown.stdout.splitlines()[0]
    assert header.startswith(f"conversation {conversation} · 2 messages · updated ")
    assert header.endswith(" UTC")


@pytest.mark.parametrize("target", ["127.0.0.1:99999", "localhost:port"])
async def test_a_target_without_a_valid_port_is_refused_before_connecting(target: str) -> None:
    """gRPC wraps port 99999 to 34463, which may be someone else's server (a fresh-user trial)."""
    result = await run_turnwire("chat", "c", "hi", "--target", target)
    assert result.code == 2
    assert f"'{target}' needs a port of 0-65535" in result.stderr


@pytest.mark.parametrize("deny", [False, True], ids=["approve", "deny"])
async def test_approve_and_deny_a_waiting_call_from_the_cli(sidecar: SidecarProcess, deny: bool) -> None:
    """Trial 4: a call awaiting approval left a CLI user stuck (only SubmitToolApprovals answered
    it). `turnwire approve CONV CALL_ID` (or --deny --reason) answers it and streams the turn on."""
    conv = f"cli-approve-{deny}"
    asked = await run_turnwire(
        "chat", conv, "What time is it?", "--target", sidecar.target, "--model", "scripted:demo"
    )
    assert asked.code == 0, asked
    (waiting,) = [line for line in asked.stdout.splitlines() if "awaits approval" in line]
    call_id = waiting.split("(call ")[1].split(":")[0]
    # With the sidecar's --target (not the default one): the command must reach this sidecar.
    suggested = f"`turnwire approve {conv} {call_id} --target {sidecar.target}`"
    assert f"{suggested}, or add --deny [--reason TEXT]" in waiting, waiting

    extra = ["--deny", "--reason", "not now"] if deny else []
    answered = await run_turnwire(
        "approve", conv, call_id, *extra, "--target", sidecar.target, "--model", "scripted:demo"
    )
    assert answered.code == 0, answered
    if deny:
        # The reason is shown with the denial, live and in history (trial 5).
        assert "← get_current_time: denied (not now)" in answered.stdout.splitlines(), answered
        shown = await run_turnwire("history", conv, "--target", sidecar.target)
        assert "← get_current_time: denied (not now)" in shown.stdout.splitlines(), shown
    else:
        assert any(
            line.startswith("← get_current_time: ") and "denied" not in line
            for line in answered.stdout.splitlines()
        )
    async with TurnwireClient(sidecar.target) as client:
        conversation = await client.get_conversation(conv)
    (call,) = [
        p.tool_call
        for m in conversation.messages
        for p in m.parts
        if p.HasField("tool_call") and p.tool_call.tool_call_id == call_id
    ]
    expected = (
        message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED if deny else message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    )
    assert call.state == expected
    if deny:
        assert call.error_text == "not now"

    again = await run_turnwire("approve", conv, call_id, "--target", sidecar.target)
    assert again.code == 2 and again.stdout == "", again  # no longer waiting: an error, on stderr
    assert again.stderr.strip(), again


async def test_history_suggests_continue_for_a_call_approved_without_a_continuation(
    sidecar: SidecarProcess,
) -> None:
    """Issue 32 item 15: approved with auto_continue off (the TypeScript client's old default),
    the call waits in approval-responded; `history` suggested `turnwire approve …`, which is
    TOOL_CALL_NOT_PENDING. It now suggests `turnwire continue`, which runs the call."""
    conv = "cli-approved-not-run"
    async with TurnwireClient(sidecar.target) as client:
        asked = await collect(client.chat(conv, "What time is it?", model="scripted:demo"))
        (call,) = asked.tool_calls
        assert call.state == "approval-requested"
        answered = await collect(
            client.submit_tool_approvals(conv, {call.tool_call_id: True}, auto_continue=False)
        )
        assert answered.status_name == "SKIPPED"
    shown = await run_turnwire("history", conv, "--target", sidecar.target)
    assert shown.code == 0, shown
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith("? get_current_time")]
    suggested = f"`turnwire continue {conv} --target {sidecar.target}`"
    assert f"approved, not run yet (run it and go on: {suggested})" in line, line
    assert "turnwire approve" not in shown.stdout
    # The command it suggests works: the approved call runs, then the model goes on.
    continued = await run_turnwire("continue", conv, "--target", sidecar.target, "--model", "scripted:demo")
    assert continued.code == 0, continued
    assert any(line.startswith("← get_current_time: ") for line in continued.stdout.splitlines()), continued


async def test_a_turn_budget_of_its_own_from_the_cli(sidecar: SidecarProcess) -> None:
    """``--budget-tokens`` / ``--budget-usd`` send the turn's own budget (docs/cost.md, "Budgets";
    none is configured here, so the request's is the turn's limit)."""
    target = ("--target", sidecar.target, "--model", "scripted:answer")
    # The prompt alone exceeds 1 token: the turn ends before its step.
    tiny = await run_turnwire("chat", "cli-budget", "hello", "--budget-tokens", "1", *target)
    assert tiny.code == 1 and "BUDGET_EXHAUSTED" in tiny.stdout and "turn budget" in tiny.stdout, tiny
    assert "The answer." not in tiny.stdout
    fits = await run_turnwire("chat", "cli-budget", "again", "--budget-tokens", "5000", *target)
    assert fits.code == 0 and "The answer." in fits.stdout, fits
    # A dollar limit reaches the sidecar: the scripted model has no price, so it cannot be
    # reserved against one (docs/cost.md, "Unknown prices and dollar budgets").
    dollars = await run_turnwire("chat", "cli-budget", "more", "--budget-usd", "1", *target)
    assert dollars.code == 1 and "pricing.models" in dollars.stdout, dollars
    tiny_continue = await run_turnwire("continue", "cli-budget", "--budget-tokens", "1", *target)
    assert tiny_continue.code == 1 and "turn budget" in tiny_continue.stdout, tiny_continue
    refused = await run_turnwire("chat", "cli-budget", "x", "--budget-usd", "-1", *target)
    assert refused.code == 2 and "--budget-usd" in refused.stderr, refused
