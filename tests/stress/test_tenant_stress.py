"""Tenants under bursts (issue 32 items 4-6), against a real ``turnwire serve`` with authentication.

* **Shares**: tenant B bursts ``ResumeTurn`` and ``WatchSubmission`` streams at once on its one
  running turn; each is admitted or refused ``OVERLOADED`` (limit ``tenant_shares.streams``), B
  never holds more than its share, and tenant A's burst of turns is admitted in full meanwhile.
* **Rate limits**: the principal ``svc`` of two tenants bursts turns at once; each gets exactly
  its own window, whatever the other does.
* **Page tokens**: tenant B pages through its submissions while tenant A submits at the same
  time; every token B gets holds B's own data only (its digest never changes, its id is B's).

Sized to run in seconds in CI: a limit of 20 slots. ``TURNWIRE_STRESS_SCALE=N`` (``make stress``:
10) multiplies the limit, the bursts and the submissions.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Iterator

import grpc
import pytest
from support.endless import endless_step
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import auth_config, new_token, write_tokens_file

from turnwire_client import TurnStream, TurnwireClient, TurnwireError, collect

SCALE = max(1, int(os.environ.get("TURNWIRE_STRESS_SCALE", "1")))
LIMIT = 20 * SCALE
SHARE = LIMIT // 2  # the default tenant_shares: half each
TURNS_PER_MINUTE = 5 * SCALE
SUBMISSIONS = 10 * SCALE

TOKEN_A = new_token()
TOKEN_B = new_token()
SVC_C = new_token()
SVC_D = new_token()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("tenant-stress")
    tokens = write_tokens_file(
        workdir / "tokens.json",
        {
            TOKEN_A: ("alice", "tenant-a"),
            TOKEN_B: ("bob", "tenant-b"),
            SVC_C: ("svc", "tenant-c"),
            SVC_D: ("svc", "tenant-d"),
        },
    )
    config = {
        "default_model": "scripted:echo",
        "providers": {
            "scripted": {"scripts": {"echo": [{"text": "answered"}], "endless": [endless_step("on ", 50)]}}
        },
        "auth": auth_config(tokens),
        "limits": {"max_concurrent_rpcs": LIMIT},
        "rate_limits": {
            "tenants": {name: {"turns_per_minute": TURNS_PER_MINUTE} for name in ("tenant-c", "tenant-d")}
        },
    }
    with running_sidecar(workdir, config) as process:
        yield process


async def admitted(stream: TurnStream) -> TurnStream | None:
    """``stream`` once its first event arrived; None when it was refused for B's share."""
    try:
        first = await anext(stream)
    except TurnwireError as error:
        assert (error.code, error.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED"), error
        assert error.error_metadata["limit"] == "tenant_shares.streams", error
        return None
    assert first.HasField("turn_start")
    return stream


async def test_a_burst_of_one_tenants_streams_leaves_the_other_its_share(sidecar: SidecarProcess) -> None:
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_B) as tenant_b,
        TurnwireClient(sidecar.target, token=TOKEN_A) as tenant_a,
    ):
        running = tenant_b.chat("b-held", "go", model="scripted:endless", request_id="b-held")
        assert await admitted(running) is running
        # A submission whose turn runs until cancelled: its WatchSubmission streams stay open too.
        submitted = await tenant_b.submit_messages("b-queued", "go", model="scripted:endless")
        watched = submitted.submission.submission_id
        burst = [
            tenant_b.resume_turn("b-held") if index % 2 else tenant_b.watch_submission(watched)
            for index in range(3 * LIMIT)
        ]
        # A's turns go while B's burst is on; B's may be refused, A's never.
        b_results, a_results = await asyncio.gather(
            asyncio.gather(*(admitted(stream) for stream in burst)),
            asyncio.gather(*(collect(tenant_a.chat(f"a-{index}", "hello")) for index in range(SHARE))),
        )
        open_b = [stream for stream in b_results if stream is not None]
        assert len(open_b) == SHARE - 1  # with its running turn's stream: exactly its share
        assert all(result.ok for result in a_results)
        for stream in (running, *open_b):
            stream.cancel()
        await tenant_b.cancel_submission(watched)


async def test_a_burst_of_same_named_principals_in_two_tenants(sidecar: SidecarProcess) -> None:
    async def burst(token: str, tenant: str) -> list[bool]:
        async with TurnwireClient(sidecar.target, token=token) as client:

            async def turn(index: int) -> bool:
                try:
                    return (await collect(client.chat(f"{tenant}-{index}", "hello"))).ok
                except TurnwireError as error:
                    assert error.reason == "RATE_LIMITED", error
                    return False

            return list(await asyncio.gather(*(turn(index) for index in range(2 * TURNS_PER_MINUTE))))

    for outcomes in await asyncio.gather(burst(SVC_C, "c"), burst(SVC_D, "d")):
        assert sum(outcomes) == TURNS_PER_MINUTE


async def test_page_tokens_while_another_tenant_submits(sidecar: SidecarProcess) -> None:
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_A) as tenant_a,
        TurnwireClient(sidecar.target, token=TOKEN_B) as tenant_b,
    ):

        async def a_submits() -> None:
            for index in range(SUBMISSIONS * 3):
                await tenant_a.submit_messages(f"a-sub-{index % 5}", "x", submission_id=f"a-sub-{index}")

        async def b_submits_and_pages() -> list[str]:
            ids = [f"b-sub-{index}" for index in range(SUBMISSIONS)]
            for submission_id in ids:
                await tenant_b.submit_messages("b-subs", "x", submission_id=submission_id)
            tokens: list[str] = []
            token = ""
            while True:
                page = await tenant_b.list_submissions(
                    page_size=1, conversation_id="b-subs", page_token=token
                )
                token = page.next_page_token
                if not token:
                    return tokens
                tokens.append(token)
                assert [s.submission_id for s in page.submissions] == [ids[len(tokens) - 1]]

        tokens = (await asyncio.gather(a_submits(), b_submits_and_pages()))[1]
    raws = [base64.urlsafe_b64decode(t + "=" * (-len(t) % 4)) for t in tokens]
    assert len(tokens) == SUBMISSIONS - 1
    assert len({raw[:9] for raw in raws}) == 1  # version and digest: the same on every page
    assert [raw[17:].decode() for raw in raws] == [f"b-sub-{index}" for index in range(SUBMISSIONS - 1)]
