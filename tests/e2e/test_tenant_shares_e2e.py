"""Tenants share the server's turn slots (``tenant_shares:``, issue 32 item 5), against a real
``turnwire serve``.

Before, ``ResumeTurn`` and ``WatchSubmission`` streams counted against ``limits.max_concurrent_rpcs``
and nothing else: tenant B ran one turn and opened 40 ``ResumeTurn`` streams on it, and tenant A's
``Chat`` was refused ``OVERLOADED``. Now each tenant holds at most its share of the slots: all its
streams together ``tenant_shares.streams``, its turn-running calls ``tenant_shares.turn_calls``;
past it only that tenant's calls are refused (``OVERLOADED``, ErrorInfo ``limit`` naming the
share, a RetryInfo), and a slot comes back when its call ends.

A turn running without a caller counts too: before, a turn left to run on (disconnect policy
CONTINUE) or started by ``SubmitMessages`` held no slot, so tenant B could run any number of
turns at once by leaving them or submitting them, while only its open calls were counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from support.endless import endless_step
from support.sidecar import SidecarFactory, SidecarProcess
from support.tokens import auth_config, new_token, write_tokens_file
from support.waiting import wait_until

from turnwire_client import TurnStream, TurnwireClient, TurnwireError, collect

TOKEN_A = new_token()
TOKEN_B = new_token()
TOKEN_BIG = new_token()

MAX_CONCURRENT_RPCS = 10

SCRIPTS = {
    "echo": [{"text": "answered"}],
    # Never ends on its own: its streams stay open until the test cancels them.
    "endless": [endless_step("still going ", 50)],
}


async def start(sidecar_factory: SidecarFactory, tmp_path: Path, **sections: Any) -> SidecarProcess:
    tokens = write_tokens_file(
        tmp_path / "tokens.json",
        {TOKEN_A: ("svc", "tenant-a"), TOKEN_B: ("svc", "tenant-b"), TOKEN_BIG: ("svc", "tenant-big")},
    )
    config = {
        "default_model": "scripted:echo",
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "auth": auth_config(tokens),
        "limits": {"max_concurrent_rpcs": MAX_CONCURRENT_RPCS},
        **sections,
    }
    return await sidecar_factory(config).start()


async def opened(stream: TurnStream) -> TurnStream:
    """``stream`` once the server admitted it (its first event, a TurnStart, arrived)."""
    assert (await anext(stream)).HasField("turn_start")
    return stream


async def refusal(stream: TurnStream) -> TurnwireError:
    with pytest.raises(TurnwireError) as raised:
        await anext(stream)
    error = raised.value
    assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED"), error
    assert error.retry_delay is not None and error.retry_delay > 0
    return error


async def test_one_tenants_streams_leave_the_others_their_share(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await start(sidecar_factory, tmp_path)  # the default shares: half the slots each
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_B) as tenant_b,
        TurnwireClient(sidecar.target, token=TOKEN_A) as tenant_a,
    ):
        running = await opened(tenant_b.chat("b-long", "go on", model="scripted:endless", request_id="b-run"))
        streams = [running]
        # B follows its turn with ResumeTurn streams until it is refused (or would hold every slot).
        refused: TurnwireError | None = None
        while refused is None and len(streams) < MAX_CONCURRENT_RPCS:
            follower = tenant_b.resume_turn("b-run")
            try:
                streams.append(await opened(follower))
            except TurnwireError as error:
                refused = error
        assert refused is not None, f"tenant B holds all {len(streams)} slots"
        assert len(streams) == MAX_CONCURRENT_RPCS // 2
        assert (refused.code, refused.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED")
        assert refused.error_metadata["limit"] == "tenant_shares.streams"
        assert "tenant_shares.streams" in refused.message
        # WatchSubmission is a stream of the same share.
        submitted = await tenant_b.submit_messages("b-queued", "later")
        watch = await refusal(tenant_b.watch_submission(submitted.submission.submission_id))
        assert watch.error_metadata["limit"] == "tenant_shares.streams"

        # Tenant A is not crowded out: its turns run, and it may open a share of its own.
        assert (await collect(tenant_a.chat("a-conv", "hello"))).ok
        a_running = await opened(
            tenant_a.chat("a-long", "go on", model="scripted:endless", request_id="a-run")
        )
        a_followers = [await opened(tenant_a.resume_turn("a-run")) for _ in range(3)]

        # A slot comes back when its stream ends.
        streams.pop().cancel()

        async def b_admitted_again() -> bool:
            follower = tenant_b.resume_turn("b-run")
            try:
                streams.append(await opened(follower))
            except TurnwireError as error:
                assert error.error_metadata.get("limit") == "tenant_shares.streams", error
                return False
            return True

        await wait_until(b_admitted_again, what="tenant B's freed slot is taken again")
        for stream in (*streams, a_running, *a_followers):
            stream.cancel()


async def test_turn_calls_have_a_share_of_their_own_and_tenants_an_override(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await start(
        sidecar_factory,
        tmp_path,
        tenant_shares={"turn_calls": 0.3, "streams": 0.5, "tenants": {"tenant-big": {"turn_calls": 0.4}}},
    )
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_B) as tenant_b,
        TurnwireClient(sidecar.target, token=TOKEN_BIG) as big,
    ):
        running = [
            await opened(tenant_b.chat(f"b-{index}", "go", model="scripted:endless", request_id=f"b-{index}"))
            for index in range(3)
        ]
        error = await refusal(tenant_b.chat("b-3", "go", model="scripted:endless"))
        assert error.error_metadata["limit"] == "tenant_shares.turn_calls"
        assert error.error_metadata["calls"] == "3"
        # Streams that follow a turn are still B's to open, up to its streams share.
        follower = await opened(tenant_b.resume_turn("b-0"))
        # tenant-big's override: four turn calls (0.4 of 10) where B gets three.
        big_running = [
            await opened(big.chat(f"big-{index}", "go", model="scripted:endless")) for index in range(4)
        ]
        error = await refusal(big.chat("big-4", "go", model="scripted:endless"))
        assert error.error_metadata["limit"] == "tenant_shares.turn_calls"
        for stream in (*running, follower, *big_running):
            stream.cancel()


async def test_turns_running_without_their_caller_count_against_the_tenants_share(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await start(sidecar_factory, tmp_path)  # the default shares: 5 running turns each
    share = MAX_CONCURRENT_RPCS // 2
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_B) as tenant_b,
        TurnwireClient(sidecar.target, token=TOKEN_A) as tenant_a,
    ):
        left = [f"b-left-{index}" for index in range(share - 2)]
        for request_id in left:  # B leaves its turns running: CONTINUE, then its call ends
            stream = await opened(
                tenant_b.chat(
                    request_id,
                    "go on",
                    model="scripted:endless",
                    request_id=request_id,
                    disconnect="continue",
                )
            )
            stream.cancel()
        submitted = [  # and submits two more: they start at once, with no caller at all
            (await tenant_b.submit_messages(f"b-sub-{index}", "go on", model="scripted:endless")).submission
            for index in range(2)
        ]

        async def b_refused() -> TurnwireError | None:
            """B's next Chat, refused for its turn share once the server saw every call of B's
            end (an admitted one is ended again: it would count itself)."""
            stream = tenant_b.chat("b-more", "hello")
            try:
                await opened(stream)
            except TurnwireError as error:
                return error
            stream.cancel()
            return None

        refused = await wait_until(b_refused, what="tenant B's turns without a caller fill its share")
        assert refused is not None  # wait_until returns only a truthy value
        assert (refused.code, refused.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED")
        assert refused.error_metadata["limit"] == "tenant_shares.turn_calls"
        assert refused.error_metadata["calls"] == str(share)
        assert "without their caller" in refused.message

        # Tenant A is not crowded: its turns run.
        assert (await collect(tenant_a.chat("a-conv", "hello"))).ok

        # The slots come back as B's turns end.
        for request_id in [*left, *(s.submission_id for s in submitted)]:
            assert await tenant_b.cancel_chat(request_id)
        await wait_until(
            lambda: _ok(collect(tenant_b.chat("b-after", "hello"))),
            what="tenant B's share is free again once its turns ended",
        )


async def _ok(turn: Any) -> bool:
    try:
        return bool((await turn).ok)
    except TurnwireError as error:
        assert error.error_metadata.get("limit") == "tenant_shares.turn_calls", error
        return False
