"""Rate limits per principal end to end (docs/operate/rate-limits.md), against a real ``turnwire serve``.

Turns per minute: the call past the limit ends ``RESOURCE_EXHAUSTED`` with ErrorInfo reason
``RATE_LIMITED`` (metadata ``limit``) and a RetryInfo delay, before any turn runs; another
principal is not affected. Tokens per minute: a turn whose reported usage spends the window
is answered in full, and the principal's next turn is refused until the window has room.
Overrides by tenant, and by principal within a tenant, take precedence over the default. A
principal is a name in one tenant: two tenants' principals of the same name have windows and
overrides of their own (issue 32 item 4).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.rpc import error_details_pb2
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import auth_config, new_token, write_tokens_file

from turnwire_client import TurnwireClient, TurnwireError, collect

TWO_TURNS = new_token()
OTHER = new_token()
TOKEN_HEAVY = new_token()
GENEROUS_TENANT = new_token()
SVC_OF_A = new_token()
SVC_OF_B = new_token()
HEAVY_NAME_ELSEWHERE = new_token()

SCRIPTS = {
    "echo": [{"text": "answered"}],
    "expensive": [{"text": "a long answer", "usage": {"input_tokens": 400, "output_tokens": 200}}],
}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("rate-limits-e2e")
    tokens = write_tokens_file(
        workdir / "tokens.json",
        {
            TWO_TURNS: ("two-turns", "t1"),
            OTHER: ("other", "t1"),
            TOKEN_HEAVY: ("token-heavy", "t1"),
            GENEROUS_TENANT: ("generous", "t2"),
            # The same principal names in other tenants.
            SVC_OF_A: ("svc", "tenant-a"),
            SVC_OF_B: ("svc", "tenant-b"),
            HEAVY_NAME_ELSEWHERE: ("token-heavy", "tenant-a"),
        },
    )
    config = {
        "default_model": "scripted:echo",
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "auth": auth_config(tokens),
        "rate_limits": {
            "turns_per_minute": 2,
            "tenants": {
                "t1": {
                    "turns_per_minute": 2,
                    "principals": {"token-heavy": {"turns_per_minute": 100, "tokens_per_minute": 500}},
                },
                "t2": {"turns_per_minute": 5},
            },
        },
    }
    with running_sidecar(workdir, config) as process:
        yield process


def retry_delay(error: TurnwireError) -> float:
    assert error.status is not None
    for detail in error.status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    raise AssertionError(f"no RetryInfo in {error.status}")


async def test_turns_per_minute(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target, token=TWO_TURNS) as client:
        assert (await collect(client.chat("limited", "one"))).ok
        submitted = await client.submit_messages("limited-submissions", "two")  # a turn too
        assert submitted.accepted
        with pytest.raises(TurnwireError) as raised:
            await collect(client.chat("limited", "three"))
        error = raised.value
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.reason == "RATE_LIMITED"
        assert error.error_metadata["limit"] == "turns_per_minute"
        assert "2 turns per minute" in error.message
        assert 0 < retry_delay(error) <= 60
        assert error.retry_delay == retry_delay(error)  # the client's own reading of RetryInfo
        # Reads are not turns: still answered.
        assert (await client.get_conversation("limited")).message_count == 2
    async with TurnwireClient(sidecar.target, token=OTHER) as other:
        assert (await collect(other.chat("limited", "mine"))).ok, "the limit is per principal"


async def test_tenant_override(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target, token=GENEROUS_TENANT) as client:
        for index in range(5):
            assert (await collect(client.chat("generous", f"turn {index}"))).ok
        with pytest.raises(TurnwireError) as raised:
            await collect(client.chat("generous", "one too many"))
        assert raised.value.reason == "RATE_LIMITED"


async def test_tokens_per_minute(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target, token=TOKEN_HEAVY) as client:
        # 600 tokens reported: the turn itself completes (its tokens are known only afterwards) ...
        first = await collect(client.chat("heavy", "think hard", model="scripted:expensive"))
        assert first.ok
        # ... and the window of 500 is spent, so the next turn is refused.
        with pytest.raises(TurnwireError) as raised:
            await collect(client.chat("heavy", "again"))
        error = raised.value
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.reason == "RATE_LIMITED"
        assert error.error_metadata["limit"] == "tokens_per_minute"
        assert 0 < retry_delay(error) <= 60


async def refused_turn(client: TurnwireClient, conversation_id: str) -> TurnwireError:
    with pytest.raises(TurnwireError) as raised:
        await collect(client.chat(conversation_id, "one too many"))
    assert raised.value.reason == "RATE_LIMITED", raised.value
    return raised.value


async def test_same_principal_name_in_two_tenants_has_two_windows(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target, token=SVC_OF_B) as tenant_b:
        for index in range(2):
            assert (await collect(tenant_b.chat("b-svc", f"turn {index}"))).ok
        await refused_turn(tenant_b, "b-svc")
    async with TurnwireClient(sidecar.target, token=SVC_OF_A) as tenant_a:
        # Tenant B's `svc` spent its window; tenant A's `svc` has all of its own.
        for index in range(2):
            assert (await collect(tenant_a.chat("a-svc", f"turn {index}"))).ok
        await refused_turn(tenant_a, "a-svc")


async def test_a_principal_override_holds_in_its_tenant_only(sidecar: SidecarProcess) -> None:
    # t1's `token-heavy` may take 100 turns a minute; tenant-a's `token-heavy` has the default 2.
    async with TurnwireClient(sidecar.target, token=HEAVY_NAME_ELSEWHERE) as client:
        for index in range(2):
            assert (await collect(client.chat("heavy-elsewhere", f"turn {index}"))).ok
        error = await refused_turn(client, "heavy-elsewhere")
        assert error.error_metadata["limit"] == "turns_per_minute"
        assert "2 turns per minute" in error.message
