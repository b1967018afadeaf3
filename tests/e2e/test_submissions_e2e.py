"""Durable submissions end to end (docs/semantics.md §7).

Idempotency by key and id (also 20 concurrent duplicates), conflicts, validation, FIFO with
the blocking paths, cancel while pending and while running (a late completion never
overwrites ``aborted``), a submission made from inside a tool, and pending submissions that
survive a SIGKILL and run after the restart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from support.endless import endless_step
from support.hooks import pythonpath_env
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

ENDLESS = "".join(f"w{i} " for i in range(30))
PENDING = chat_service_pb2.SUBMISSION_STATE_PENDING
RUNNING = chat_service_pb2.SUBMISSION_STATE_RUNNING
COMPLETED = chat_service_pb2.SUBMISSION_STATE_COMPLETED
ABORTED = chat_service_pb2.SUBMISSION_STATE_ABORTED
FINAL = (
    COMPLETED,
    ABORTED,
    chat_service_pb2.SUBMISSION_STATE_ERROR,
    chat_service_pb2.SUBMISSION_STATE_SKIPPED,
)


def config(**durability: object) -> dict[str, object]:
    return {
        "default_model": "scripted:echo",
        "providers": {
            "scripted": {
                "scripts": {
                    "echo": [{"text": "answered"}],
                    # 30 chunks, 150 ms each: about 4.5 s, for a turn that must also complete;
                    # the few calls a test makes while it runs fit in that on a loaded machine.
                    "slow": [{"text": " ".join(f"w{i}" for i in range(30)), "delay_ms": 150}],
                    # Never ends on its own: the test cancels it.
                    "endless": [endless_step(ENDLESS, 60)],
                    # Never ends until the process dies; recovered after a restart, it answers.
                    "endless-until-recovered": [
                        {**endless_step(ENDLESS, 60), "retry": {"text": "recovered"}}
                    ],
                    "followup": [
                        {"tool_calls": [{"name": "submit_followup", "input": {"text": "and then?"}}]},
                        {"text": "submitted a follow-up"},
                    ],
                }
            }
        },
        "tools": {"python": ["support.durable_tools:submit_followup"]},
        "durability": dict(durability),
    }


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


async def settled(client: TurnwireClient, *ids: str) -> list[chat_service_pb2.Submission]:
    records: list[chat_service_pb2.Submission] = []

    async def done() -> bool:
        records[:] = [await client.get_submission(i) for i in ids]
        return all(r.state in FINAL for r in records)

    await wait_until(done, timeout=20, what=f"submissions {ids} end")
    return records


async def test_duplicates_by_key_and_id_return_the_first_submission(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(config(), env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target) as client:
        first = await client.submit_messages("dup", "hello", idempotency_key="k-1", metadata={"n": 1})
        assert first.accepted
        assert first.submission.state in (PENDING, RUNNING, COMPLETED)
        again = await client.submit_messages("dup", "hello", idempotency_key="k-1", metadata={"n": 1})
        assert not again.accepted
        assert again.submission.submission_id == first.submission.submission_id

        sid = first.submission.submission_id
        by_id = await client.submit_messages(
            "dup", "hello", submission_id=sid, idempotency_key="k-1", metadata={"n": 1}
        )
        assert not by_id.accepted and by_id.submission.submission_id == sid

        # 20 concurrent duplicates of a new key: one submission.
        racers = await asyncio.gather(
            *(client.submit_messages("dup", "again", idempotency_key="k-race") for _ in range(20))
        )
        assert sum(r.accepted for r in racers) == 1
        assert len({r.submission.submission_id for r in racers}) == 1

        await settled(client, sid, racers[0].submission.submission_id)
        listed = await client.list_submissions(conversation_id="dup")
        assert len(listed.submissions) == 2
        stored = await client.get_conversation("dup")
        assert [text_of(m) for m in stored.messages] == ["hello", "answered", "again", "answered"]
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_conflicts_and_empty_lists_are_refused(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(config(), env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target) as client:
        a = await client.submit_messages("conf", "one", submission_id="s-a", idempotency_key="k-a")
        b = await client.submit_messages("conf", "two", submission_id="s-b", idempotency_key="k-b")
        assert a.accepted and b.accepted
        conflicts: list[tuple[dict[str, Any], str]] = [
            ({"submission_id": "s-a", "idempotency_key": "k-b"}, "name different submissions"),
            ({"submission_id": "s-a"}, "with other content"),
        ]
        for kwargs, why in conflicts:
            try:
                await client.submit_messages("conf", "one" if "k-b" in kwargs.values() else "other", **kwargs)
            except TurnwireError as error:
                assert error.code == grpc.StatusCode.ALREADY_EXISTS, error
                assert error.reason == "SUBMISSION_CONFLICT"
                assert why in error.message, error.message
            else:
                raise AssertionError(f"{kwargs} must conflict")
        try:
            await client.submit_messages("conf", [])
        except TurnwireError as error:
            assert error.code == grpc.StatusCode.INVALID_ARGUMENT
            assert ("messages", "must contain at least one message") in error.field_violations
        else:
            raise AssertionError("an empty submission must be refused")
        await settled(client, "s-a", "s-b")
        assert len((await client.list_submissions(conversation_id="conf")).submissions) == 2
        try:
            await client.get_submission("s-none")
        except TurnwireError as error:
            assert error.code == grpc.StatusCode.NOT_FOUND and error.reason == "SUBMISSION_NOT_FOUND"
            # A schedule's fire id is derived (tw-<schedule id>.<n>): the message says where to read it.
            assert "last_submission_id (GetSchedule)" in str(error)
        else:
            raise AssertionError("unknown submission")
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_three_submissions_and_a_chat_run_first_in_first_out(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(config(), env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target) as client:
        s1 = await client.submit_messages("fifo", "q1", submission_id="s-1", model="scripted:slow")
        s2 = await client.submit_messages("fifo", "q2", submission_id="s-2")
        chat = asyncio.ensure_future(collect(client.chat("fifo", "q3")))

        async def chat_queued() -> bool:
            return not chat.done() and (await client.get_submission("s-2")).state == PENDING

        await wait_until(chat_queued, what="the chat waits behind the submissions")
        s4 = await client.submit_messages("fifo", "q4", submission_id="s-4")
        assert all(s.accepted for s in (s1, s2, s4))
        result = await chat
        assert result.ok, result.error
        records = await settled(client, "s-1", "s-2", "s-4")
        assert [r.state for r in records] == [COMPLETED] * 3
        stored = await client.get_conversation("fifo")
        assert [text_of(m) for m in stored.messages][::2] == ["q1", "q2", "q3", "q4"]
        starts = [r.start_time.ToNanoseconds() for r in records]
        assert starts == sorted(starts)
        listed = await client.list_submissions(conversation_id="fifo", page_size=2)
        assert [s.submission_id for s in listed.submissions] == ["s-1", "s-2"]
        more = await client.list_submissions(
            conversation_id="fifo", page_size=2, page_token=listed.next_page_token
        )
        assert [s.submission_id for s in more.submissions] == ["s-4"] and not more.next_page_token
        done = await client.list_submissions(conversation_id="fifo", state=COMPLETED)
        assert len(done.submissions) == 3
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_cancel_pending_and_running_submissions(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(config(), env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target) as client:
        await client.submit_messages("cancel", "long", submission_id="c-run", model="scripted:endless")
        await client.submit_messages("cancel", "never", submission_id="c-pend")

        async def running() -> bool:
            return (await client.get_submission("c-run")).state == RUNNING

        await wait_until(running, what="the first submission runs")
        pending = await client.cancel_submission("c-pend")
        assert pending.state == ABORTED
        assert pending.error.message and "not stored" in pending.error.message
        cancelled = await client.cancel_submission("c-run")
        assert cancelled.state == ABORTED

        watched = [e async for e in client.watch_submission("c-run")]
        assert watched[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
        never = [e async for e in client.watch_submission("c-pend")]
        assert [e.turn_end.status for e in never] == [event_pb2.TURN_STATUS_ABORTED]

        # Once the turn has ended for good, the record still says aborted.
        final = await settled(client, "c-run", "c-pend")
        assert [r.state for r in final] == [ABORTED, ABORTED]
        assert (await client.cancel_submission("c-run")).state == ABORTED, "cancelling again changes nothing"
        stored = await client.get_conversation("cancel")
        assert "never" not in [text_of(m) for m in stored.messages], "a cancelled pending one stores nothing"
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_a_tool_submits_to_its_own_conversation_and_it_runs_after_the_turn(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = sidecar_factory(config(), env=pythonpath_env())
    sidecar.extra_env["TURNWIRE_TEST_TARGET"] = sidecar.target
    await sidecar.start()
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("inner", "start", model="scripted:followup"))
        assert result.ok, result.error
        output = result.tool_calls[0].output
        assert output["accepted"] is True, output
        listed = await client.list_submissions(conversation_id="inner")
        (submission,) = listed.submissions
        (record,) = await settled(client, submission.submission_id)
        assert record.state == COMPLETED
        stored = await client.get_conversation("inner")
        assert [text_of(m) for m in stored.messages] == [
            "start",
            "submitted a follow-up",
            "and then?",
            "answered",
        ]
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_pending_submissions_survive_sigkill_and_run_after_restart(
    sidecar_factory: SidecarFactory,
) -> None:
    first = await sidecar_factory(config(), env=pythonpath_env()).start()
    async with TurnwireClient(first.target) as client:
        for index in range(3):
            await client.submit_messages(
                "survive",
                f"q{index}",
                submission_id=f"p-{index}",
                model="scripted:endless-until-recovered" if index == 0 else "",
            )

        async def first_runs() -> bool:
            return (await client.get_submission("p-0")).state == RUNNING

        await wait_until(first_runs, what="the first submission runs")
        assert (await client.get_submission("p-2")).state == PENDING
    first.kill()

    second = await sidecar_factory(config(), env=pythonpath_env()).start()
    async with TurnwireClient(second.target) as client:
        records = await settled(client, "p-0", "p-1", "p-2")
        assert [r.state for r in records] == [COMPLETED] * 3
        stored = await client.get_conversation("survive")
        assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT] * 3
        assert [text_of(m) for m in stored.messages][::2] == ["q0", "q1", "q2"]
    assert await second.terminate() == 0, second.log_text()


async def test_pending_submissions_and_client_calls_expire_in_the_sweep(
    sidecar_factory: SidecarFactory,
) -> None:
    """docs/semantics.md §12: pending submissions and client tool calls expire after
    durability.pending_expiry_seconds; the maintenance sweep ends them without any request."""
    cfg = config(pending_expiry_seconds=1.0, sweep_interval_seconds=0.2)
    cfg["providers"]["scripted"]["scripts"]["client-call"] = [  # type: ignore[index]
        {"tool_calls": [{"name": "lookup", "input": {"q": "x"}}]}
    ]
    sidecar = await sidecar_factory(cfg, env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target) as client:
        await client.submit_messages("exp", "long", submission_id="e-run", model="scripted:endless")
        await client.submit_messages("exp", "waits too long", submission_id="e-wait")
        tool = {"name": "lookup", "description": "look it up", "input_schema": {"type": "object"}}
        pending = await collect(
            client.chat("exp-call", "look", model="scripted:client-call", client_tools=[tool])
        )
        assert pending.tool_calls[0].state == "input-available"

        async def submission_expired() -> bool:
            return (await client.get_submission("e-wait")).state == chat_service_pb2.SUBMISSION_STATE_ERROR

        await wait_until(submission_expired, timeout=15, what="the waiting submission expires")
        expired = await client.get_submission("e-wait")
        assert "pending_expiry_seconds" in expired.error.message

        async def call_expired() -> bool:
            stored = await client.get_conversation("exp-call")
            calls = [p.tool_call for p in stored.messages[-1].parts if p.WhichOneof("kind") == "tool_call"]
            return calls[0].state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR

        await wait_until(call_expired, timeout=15, what="the pending client call expires")
        await client.cancel_submission("e-run")
        stored = await client.get_conversation("exp")
        assert "waits too long" not in [text_of(m) for m in stored.messages], (
            "an expired submission stores nothing"
        )
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_past_its_bound_a_process_leaves_submissions_waiting_in_their_place(
    sidecar_factory: SidecarFactory,
) -> None:
    """``durability.max_running_submissions: 1`` (the single-process store, the same path as
    replicas): a second submission starts only when the first ends, and a call made after it on
    its conversation still goes after it (its place was taken at acceptance)."""
    sidecar = await sidecar_factory(config(max_running_submissions=1), env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target) as client:
        await client.submit_messages("first", "slow one", submission_id="b-0", model="scripted:slow")
        await client.submit_messages("second", "q", submission_id="b-1")
        after = asyncio.ensure_future(collect(client.chat("second", "after it", request_id="r-after")))
        assert (await client.get_submission("b-1")).state == PENDING, "b-1 waits while b-0 runs"
        first, second = await settled(client, "b-0", "b-1")
        assert [first.state, second.state] == [COMPLETED, COMPLETED]
        assert second.start_time.ToDatetime() >= first.end_time.ToDatetime(), "one submission at a time"
        assert (await after).ok
        stored = await client.get_conversation("second")
        assert [text_of(m) for m in stored.messages] == ["q", "answered", "after it", "answered"]
    assert await sidecar.terminate() == 0, sidecar.log_text()
