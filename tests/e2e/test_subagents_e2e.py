"""Sub-agents with nested streams, end to end (docs/subagents.md): a real ``turnwire serve``
whose config declares sub-agents, driven by the Python client, the offline scripted model making
the tool calls.

A call nested two deep (top → ``researcher`` → ``checker``): the top-level stream carries both
children's events in order, wrapped in ``SubagentEvent``s with their path; each conversation's
transcript is right; each chain's hooks fire in the docs/semantics.md §4 order, the children's on
the ``subagent`` entry path; resuming the top-level stream replays the nested events exactly
once. A child's failure is the call's error; cancelling the parent mid-child cancels the child;
deleting the parent's conversation deletes its children.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, message_pb2

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """A conversation id unique within the shared sidecar."""
    return f"{prefix}-{next(_ids)}"


def recorder(label: str, log: Path) -> dict[str, Any]:
    """The config entry of a :class:`support.subagent_hooks.RecordHooks` labelled ``label``."""
    return {"path": "support.subagent_hooks:RecordHooks", "options": {"label": label, "path": str(log)}}


def config(log: Path) -> dict[str, Any]:
    """Scripts for each model, four sub-agents, a recording middleware in each chain."""
    return {
        "default_model": "scripted:top",
        "providers": {
            "scripted": {
                "scripts": {
                    "top": [
                        {"tool_calls": [{"name": "researcher", "input": {"prompt": "Find the answer."}}]},
                        {"text": "Top-level answer."},
                    ],
                    "research": [
                        {"tool_calls": [{"name": "checker", "input": {"prompt": "Check 42."}}]},
                        {"text": "Researched: 42."},
                    ],
                    "check": [{"text": "Checked."}],
                    "top-fails": [
                        {"tool_calls": [{"name": "breaker", "input": {"prompt": "Try."}}]},
                        {"text": "The sub-agent failed."},
                    ],
                    "broken": [{"error": {"message": "the model is down", "retryable": False}}],
                    "top-waits": [
                        {"tool_calls": [{"name": "slowpoke", "input": {"prompt": "Go on."}}]},
                        {"text": "never"},
                    ],
                    "endless": [{"text": "more ", "delay_ms": 50, "until_cancelled": True}],
                    "recurse": [
                        {"tool_calls": [{"name": "recursive", "input": {"prompt": "Deeper."}}]},
                        {"text": "Unwound."},
                    ],
                    "top-delegates": [
                        {
                            "tool_calls": [
                                {"name": "delegate", "input": {"subagent": "checker", "prompt": "Check 7."}}
                            ]
                        },
                        {"text": "Delegated."},
                    ],
                }
            }
        },
        "tools": {"python": ["support.subagent_hooks:delegate"]},
        "middleware": [recorder("top", log), {"path": "support.subagent_hooks:ReviewFromBody"}],
        "subagents": [
            {
                "name": "researcher",
                "description": "Researches a question.",
                "model": "scripted:research",
                "system_prompt": "You research.",
                "tools": ["checker"],
                "middleware": [recorder("researcher", log)],
            },
            {
                "name": "checker",
                "description": "Checks a claim.",
                "model": "scripted:check",
                "max_steps": 1,
                "middleware": [recorder("checker", log)],
            },
            {"name": "breaker", "description": "Always fails.", "model": "scripted:broken"},
            {"name": "slowpoke", "description": "Never finishes.", "model": "scripted:endless"},
            {
                "name": "recursive",
                "description": "Calls itself.",
                "model": "scripted:recurse",
                "tools": ["recursive"],
            },
        ],
        "limits": {"max_subagent_depth": 2},
    }


@pytest.fixture(scope="module")
def hook_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JSON-lines log every chain's recorder appends to."""
    return tmp_path_factory.mktemp("subagent-hooks") / "hooks.jsonl"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, hook_log: Path) -> Iterator[SidecarProcess]:
    """One server for the module, with ``tests/`` on its PYTHONPATH."""
    with running_sidecar(
        tmp_path_factory.mktemp("subagents-e2e"), config(hook_log), pythonpath_env()
    ) as process:
        yield process


def hooks_of(log: Path, request_id: str) -> list[dict[str, Any]]:
    """The recorded hook calls of turn ``request_id``, in order."""
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line["request_id"] == request_id]


def nested(events: list[event_pb2.TurnEvent], depth: int) -> list[event_pb2.SubagentEvent]:
    """The ``SubagentEvent``s of ``events`` whose path is ``depth`` calls long."""
    return [
        e.subagent_event
        for e in events
        if e.WhichOneof("event") == "subagent_event" and len(e.subagent_event.path) == depth
    ]


def kinds(events: list[event_pb2.SubagentEvent]) -> list[str]:
    """The kind of each wrapped event, text deltas and keepalive-like noise left out."""
    skip = {"text_delta", "text_start", "text_end", "tool_input_start", "tool_input_delta"}
    return [k for e in events if (k := str(e.event.WhichOneof("event"))) not in skip]


def texts(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


ONE_TOOL_CALL = [
    "before_turn",
    "before_step",
    "before_tool_call",
    "after_tool_call",
    "on_step_finish",
    "before_step",
    "on_step_finish",
    "on_chat_response",
]
"""A turn whose first step makes one tool call, as docs/semantics.md §4 draws it."""


async def test_a_call_nested_two_deep(sidecar: SidecarProcess, hook_log: Path) -> None:
    conversation = new_id("nested")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "What is the answer?", request_id=new_id("req")))
        assert result.ok, result.error
        events = list(result.events)
        top_request = events[0].request_id

        # The top-level stream: its own events numbered 1..n without gaps, children's inside.
        assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
        child, grandchild = nested(events, 1), nested(events, 2)
        assert kinds(child) == [
            "turn_start",
            "step_start",
            "tool_input_available",
            "tool_output_available",
            "step_finish",
            "step_start",
            "step_finish",
            "turn_end",
        ]
        assert kinds(grandchild) == ["turn_start", "step_start", "step_finish", "turn_end"]
        # Each stream complete and in order: the grandchild's as it numbered it; the child's with
        # a gap where each grandchild event came (the child's wrapper of it, unwrapped here).
        assert [e.event.sequence_number for e in grandchild] == list(range(1, len(grandchild) + 1))
        numbers = [e.event.sequence_number for e in child]
        assert numbers == sorted(set(numbers))
        assert numbers[-1] == len(child) + len(grandchild)
        research_call, check_call = grandchild[0].path
        assert (research_call.subagent, check_call.subagent) == ("researcher", "checker")
        assert all(list(e.path)[:1] == [research_call] for e in child)
        assert research_call.conversation_id == f"{conversation}:sub-" + research_call.conversation_id[-16:]
        assert check_call.conversation_id.startswith(research_call.conversation_id + ":sub-")
        # The grandchild runs inside the child's call of it: between its input and its output.
        order = [
            (len(e.subagent_event.path), e.subagent_event.event.WhichOneof("event"))
            for e in events
            if e.WhichOneof("event") == "subagent_event"
        ]
        assert order.index((1, "tool_input_available")) < order.index((2, "turn_start"))
        assert order.index((2, "turn_end")) < order.index((1, "tool_output_available"))
        outputs = [
            e.tool_output_available for e in events if e.WhichOneof("event") == "tool_output_available"
        ]
        assert [(o.tool_name, o.output_json) for o in outputs] == [("researcher", '"Researched: 42."')]
        assert result.text == "Top-level answer."

        # Each transcript: its question, the reply with its tool call and result.
        top = await client.get_conversation(conversation)
        research = await client.get_conversation(research_call.conversation_id)
        check = await client.get_conversation(check_call.conversation_id)
    assert [texts(m) for m in research.messages] == ["Find the answer.", "Researched: 42."]
    research_calls = [p.tool_call for p in research.messages[1].parts if p.WhichOneof("kind") == "tool_call"]
    assert [(c.tool_name, c.output_json) for c in research_calls] == [("checker", '"Checked."')]
    assert [texts(m) for m in check.messages] == ["Check 42.", "Checked."]
    top_calls = [p.tool_call for p in top.messages[1].parts if p.WhichOneof("kind") == "tool_call"]
    assert [(c.tool_name, c.output_json) for c in top_calls] == [("researcher", '"Researched: 42."')]

    # Each chain's hooks in the §4 order, the children's on the subagent entry path.
    top_hooks = hooks_of(hook_log, top_request)
    research_hooks = hooks_of(hook_log, research_call.request_id)
    check_hooks = hooks_of(hook_log, check_call.request_id)
    assert [h["hook"] for h in top_hooks] == ONE_TOOL_CALL
    assert [h["hook"] for h in research_hooks] == ONE_TOOL_CALL
    assert [h["hook"] for h in check_hooks] == [
        "before_turn",
        "before_step",
        "on_step_finish",
        "on_chat_response",
    ]
    assert {h["label"] for h in top_hooks} == {"top"}
    assert {h["label"] for h in research_hooks} == {"researcher"}
    assert {h["label"] for h in check_hooks} == {"checker"}
    assert (top_hooks[0]["entry"], top_hooks[0]["path"]) == ("chat", [])
    assert research_hooks[0]["entry"] == "subagent"
    assert [name for name, _ in research_hooks[0]["path"]] == ["researcher"]
    assert [name for name, _ in check_hooks[0]["path"]] == ["researcher", "checker"]
    assert research_hooks[0]["system"] == "You research."


async def test_resume_replays_the_nested_events_exactly_once(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(new_id("resume"), "What is the answer?"))
        assert result.ok, result.error
        events = list(result.events)
        request_id = events[0].request_id
        first_nested = next(e.sequence_number for e in events if e.WhichOneof("event") == "subagent_event")
        after = first_nested + 3  # in the middle of the nested events
        replayed = await collect(client.resume_turn(request_id, after))
    assert [e.SerializeToString() for e in replayed.events] == [
        e.SerializeToString() for e in events if e.sequence_number > after
    ]


async def test_a_childs_failure_is_the_tool_error(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(new_id("fails"), "Try it.", model="scripted:top-fails"))
    assert result.ok, result.error
    events = list(result.events)
    errors = [e.tool_output_error for e in events if e.WhichOneof("event") == "tool_output_error"]
    assert [e.tool_name for e in errors] == ["breaker"]
    assert errors[0].error_text.startswith("sub-agent 'breaker' ended ERROR: ")
    child_end = [e.event.turn_end for e in nested(events, 1) if e.event.HasField("turn_end")]
    assert [end.status for end in child_end] == [event_pb2.TURN_STATUS_ERROR]
    assert result.text == "The sub-agent failed."


async def test_cancelling_the_parent_cancels_the_child(sidecar: SidecarProcess) -> None:
    conversation = new_id("cancel")
    request_id = new_id("cancel-req")
    events: list[event_pb2.TurnEvent] = []
    async with TurnwireClient(sidecar.target) as client:

        async def read() -> None:
            async for event in client.chat(
                conversation, "Start.", model="scripted:top-waits", request_id=request_id
            ):
                events.append(event)

        reader = asyncio.create_task(read())
        # The child streams: its text reaches the parent's stream, nested.
        await wait_until(
            lambda: any(e.event.WhichOneof("event") == "text_delta" for e in nested(events, 1)),
            what="the child's text in the parent's stream",
        )
        assert await client.cancel_chat(request_id)
        await asyncio.wait_for(reader, 30)
        child_conversation = nested(events, 1)[0].path[0].conversation_id
        child = await client.get_conversation(child_conversation)
    child_ends = [e.event.turn_end for e in nested(events, 1) if e.event.HasField("turn_end")]
    assert [end.status for end in child_ends] == [event_pb2.TURN_STATUS_ABORTED]
    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
    # The child's end comes before the parent's: the nesting stays whole.
    kinds_in_order = [e.WhichOneof("event") for e in events]
    assert kinds_in_order.index("subagent_event") < kinds_in_order.index("turn_end")
    assert child.messages[-1].role == message_pb2.ROLE_ASSISTANT
    assert texts(child.messages[-1]).startswith("more ")


async def test_deleting_the_parent_deletes_its_children(sidecar: SidecarProcess) -> None:
    conversation = new_id("delete")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "What is the answer?"))
        assert result.ok, result.error
        research_call, check_call = nested(list(result.events), 2)[0].path
        listed = await client.list_conversations()
        ids = {c.conversation_id for c in listed.conversations}
        assert {research_call.conversation_id, check_call.conversation_id} <= ids
        await client.delete_conversation(conversation)
        for child in (research_call.conversation_id, check_call.conversation_id):
            with pytest.raises(TurnwireError) as missing:
                await client.get_conversation(child)
            assert missing.value.reason == "CONVERSATION_NOT_FOUND"


async def test_a_tool_and_a_hook_call_a_subagent_through_the_sdk(
    sidecar: SidecarProcess, hook_log: Path
) -> None:
    async with TurnwireClient(sidecar.target) as client:
        by_tool = await collect(client.chat(new_id("sdk-tool"), "Delegate.", model="scripted:top-delegates"))
        by_hook = await collect(
            client.chat(new_id("sdk-hook"), "Hi.", model="scripted:check", body={"review": "Check 9."})
        )
    assert by_tool.ok and by_hook.ok, (by_tool.error, by_hook.error)
    outputs = [
        e.tool_output_available for e in by_tool.events if e.WhichOneof("event") == "tool_output_available"
    ]
    assert [(o.tool_name, json.loads(o.output_json)) for o in outputs] == [
        ("delegate", {"answer": "Checked."})
    ]
    tool_nested = nested(list(by_tool.events), 1)
    assert {(c.subagent, c.tool_call_id) for e in tool_nested for c in e.path} == {
        ("checker", f"{outputs[0].tool_call_id}.checker")
    }
    assert kinds(tool_nested) == ["turn_start", "step_start", "step_finish", "turn_end"]
    # The hook's call runs in before_turn: nested after the turn's TurnStart, before its first step.
    hook_events = list(by_hook.events)
    hook_kinds = [e.WhichOneof("event") for e in hook_events]
    assert hook_kinds[0] == "turn_start"
    assert hook_kinds.index("subagent_event") < hook_kinds.index("step_start")
    assert {c.tool_call_id for e in nested(hook_events, 1) for c in e.path} == {"review"}
    steps = [h for h in hooks_of(hook_log, hook_events[0].request_id) if h["hook"] == "before_step"]
    assert steps[0]["system"].endswith("The reviewer said: Checked.")


async def test_calls_nest_at_most_max_subagent_depth(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(new_id("depth"), "Recurse.", model="scripted:recurse"))
    assert result.ok, result.error
    events = list(result.events)
    # Top → recursive (depth 1) → recursive (depth 2), whose own call is refused: nothing deeper.
    assert nested(events, 1) and nested(events, 2) and not nested(events, 3)
    refused = [e.event.tool_output_error for e in nested(events, 2) if e.event.HasField("tool_output_error")]
    assert [r.error_text for r in refused] == [
        "sub-agent 'recursive' not run: 2 sub-agent calls deep already, the limit "
        "(limits.max_subagent_depth) is 2"
    ]
    assert result.text == "Unwound."


def test_the_start_up_line_names_the_sub_agents(sidecar: SidecarProcess) -> None:
    """Stop 66's operator trial: the start-up lines named the tools and middleware but not the
    configured sub-agents, which the model is offered as tools too."""
    (line,) = [
        line for line in sidecar.log_text().splitlines() if "tools: " in line and "middleware: " in line
    ]
    assert "sub-agents: researcher, checker, breaker, slowpoke, recursive;" in line, line
