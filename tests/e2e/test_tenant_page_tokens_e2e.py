"""Page tokens tell a tenant nothing of the others (issue 32 item 6), against a real ``turnwire serve``.

``ListSubmissions`` tokens carried the store-wide sequence number: tenant B read 1, 2, 20 in
its tokens around tenant A's 17 submissions. Now every page token holds only the caller's own
data (its last item's id and time, a digest of its filters and scope: see
``turnwire_server.store.core.page_tokens``), and a token is refused (``INVALID_ARGUMENT``,
reason ``INVALID_PAGE_TOKEN``) in another tenant's listing, as any forged one is.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Awaitable, Iterator
from typing import Any

import grpc
import pytest
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import auth_config, new_token, write_tokens_file

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import chat_service_pb2

TOKEN_A = new_token()
TOKEN_B = new_token()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("tenant-page-tokens-e2e")
    tokens = write_tokens_file(
        workdir / "tokens.json", {TOKEN_A: ("svc", "tenant-a"), TOKEN_B: ("svc", "tenant-b")}
    )
    config = {
        "default_model": "scripted:echo",
        "providers": {"scripted": {"scripts": {"echo": [{"text": "answered"}]}}},
        "auth": auth_config(tokens),
    }
    with running_sidecar(workdir, config) as process:
        yield process


def payload(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def micros(submission: chat_service_pb2.Submission) -> int:
    return submission.create_time.seconds * 1_000_000 + submission.create_time.nanos // 1000


async def invalid_page_token(call: Awaitable[Any]) -> None:
    with pytest.raises(TurnwireError) as raised:
        await call
    assert (raised.value.code, raised.value.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )


async def test_submission_tokens_carry_only_the_callers_own_data(sidecar: SidecarProcess) -> None:
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_A) as tenant_a,
        TurnwireClient(sidecar.target, token=TOKEN_B) as tenant_b,
    ):
        for index in range(2):
            await tenant_b.submit_messages("b-queue", f"b {index}", submission_id=f"sub-b-{index}")
        first = await tenant_b.list_submissions(page_size=1)
        # Tenant A is busy between B's pages.
        for index in range(17):
            await tenant_a.submit_messages(f"a-{index}", f"a {index}", submission_id=f"sub-a-{index}")
        await tenant_b.submit_messages("b-queue", "b 2", submission_id="sub-b-2")
        second = await tenant_b.list_submissions(page_size=1, page_token=first.next_page_token)
        assert [s.submission_id for s in second.submissions] == ["sub-b-1"]
        assert second.next_page_token

        # Each token is: a version byte, a digest of B's filters and scope (the same for both
        # pages, whatever A did between them), the time B's last listed submission was created
        # and its id. Nothing counts A's submissions (the old tokens held the store-wide seq).
        tokens = {page.submissions[-1].submission_id: page.next_page_token for page in (first, second)}
        listed = {s.submission_id: s for page in (first, second) for s in page.submissions}
        digests = set()
        for submission_id, token in tokens.items():
            raw = payload(token)
            digests.add(raw[1:9])
            assert raw[0:1] + raw[9:] == b"\x02" + struct.pack(">q", micros(listed[submission_id])) + (
                submission_id.encode()
            )
        assert len(digests) == 1
        assert b"tenant-b" not in b"".join(payload(t) for t in tokens.values())

        # Another tenant's token is refused like a forged one, never read as a position.
        await invalid_page_token(tenant_a.list_submissions(page_size=1, page_token=second.next_page_token))
        # B's own listing goes on with it.
        third = await tenant_b.list_submissions(page_size=5, page_token=second.next_page_token)
        assert [s.submission_id for s in third.submissions] == ["sub-b-2"]


async def test_conversation_tokens_are_bound_to_the_callers_listing(sidecar: SidecarProcess) -> None:
    async with (
        TurnwireClient(sidecar.target, token=TOKEN_A) as tenant_a,
        TurnwireClient(sidecar.target, token=TOKEN_B) as tenant_b,
    ):
        for index in range(2):
            assert (await collect(tenant_a.chat(f"a-conv-{index}", "hello"))).ok
            assert (await collect(tenant_b.chat(f"b-conv-{index}", "hello"))).ok
        page = await tenant_b.list_conversations(page_size=1)
        assert page.next_page_token
        assert b"tenant-b" not in payload(page.next_page_token)  # B's ids, without the store's prefix
        await invalid_page_token(tenant_a.list_conversations(page_size=1, page_token=page.next_page_token))
        rest = await tenant_b.list_conversations(page_size=100, page_token=page.next_page_token)
        assert all(c.conversation_id.startswith("b-") for c in rest.conversations)
        assert len(rest.conversations) >= 1
