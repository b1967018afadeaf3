"""Authentication end to end (docs/operate/authentication.md), against a real ``turnwire serve``.

Bearer tokens missing, malformed, unknown, expired, not yet valid, for another audience or
issuer, badly signed, with a forbidden algorithm, without a tenant: each ends the call
``UNAUTHENTICATED`` with ErrorInfo reason ``TOKEN_MISSING`` / ``TOKEN_INVALID`` /
``TOKEN_EXPIRED`` and a message that says what to fix and holds no token. Valid static tokens
and JWTs run turns. Health and reflection answer without a token (and health can be closed).
No token appears in the server's log at debug level. Hostile JWT headers (numeric ``kid``,
``crit``) end ``UNAUTHENTICATED`` with one log line each and no traceback; SIGHUP re-reads the
tokens file and the key set, so a revoked token or a retired key is refused without a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.malformed_jwts import signed, valid_claims
from support.sidecar import SidecarFactory, SidecarProcess, run_turnwire, running_sidecar
from support.tokens import AUDIENCE, Issuer, auth_config, new_token, write_jwks, write_tokens_file
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect

STATIC = new_token()
SIGNER = Issuer("key-1")
STRANGER = Issuer("key-1")  # the same key id, another key: its signatures must not verify


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("auth-e2e")


@pytest.fixture(scope="module")
def sidecar(workdir: Path) -> Iterator[SidecarProcess]:
    tokens = write_tokens_file(workdir / "tokens.json", {STATIC: ("static-user", "tenant-s")})
    jwks = write_jwks(workdir / "jwks.json", SIGNER)
    config = {"logging": {"level": "debug"}, "auth": auth_config(tokens, jwks)}
    with running_sidecar(workdir, config) as process:
        yield process


def b64(raw: bytes) -> str:
    """base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


async def refusal(target: str, token: str | None = None, authorization: str | None = None) -> TurnwireError:
    """The error of a GetConversation sent with ``token`` (or raw ``authorization`` metadata)."""
    metadata = [("authorization", authorization)] if authorization is not None else []
    async with TurnwireClient(target, token=token, metadata=metadata) as client:
        with pytest.raises(TurnwireError) as raised:
            await client.get_conversation("any-conversation")
    error = raised.value
    assert error.code == grpc.StatusCode.UNAUTHENTICATED, error
    assert error.domain == "turnwire.dev"
    if token:
        assert token not in str(error) and token not in repr(error.status)
    return error


async def test_a_call_without_a_token_is_refused(sidecar: SidecarProcess) -> None:
    error = await refusal(sidecar.target)
    assert error.reason == "TOKEN_MISSING"
    assert "authorization: Bearer <token>" in error.message
    async with TurnwireClient(sidecar.target) as client:
        with pytest.raises(TurnwireError) as raised:
            await collect(client.chat("c", "hello"))
    assert raised.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert raised.value.reason == "TOKEN_MISSING"


@pytest.mark.parametrize("authorization", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer two words", "token-only"])
async def test_malformed_authorization_is_refused(sidecar: SidecarProcess, authorization: str) -> None:
    error = await refusal(sidecar.target, authorization=authorization)
    assert error.reason == "TOKEN_INVALID"
    assert "Bearer <token>" in error.message


async def test_an_unknown_static_token_is_refused(sidecar: SidecarProcess) -> None:
    error = await refusal(sidecar.target, token=new_token())
    assert error.reason == "TOKEN_INVALID"
    assert "not one this server accepts" in error.message


async def test_an_expired_jwt_is_refused(sidecar: SidecarProcess) -> None:
    long_ago = int(time.time()) - 3600
    error = await refusal(sidecar.target, token=SIGNER.sign(iat=long_ago - 60, exp=long_ago))
    assert error.reason == "TOKEN_EXPIRED"
    assert "expired" in error.message


async def test_a_jwt_within_the_leeway_is_accepted(sidecar: SidecarProcess) -> None:
    # auth.jwt.leeway_seconds (30 s by default) allows for clock skew on exp.
    token = SIGNER.sign(exp=int(time.time()) - 5)
    async with TurnwireClient(sidecar.target, token=token) as client:
        assert (await client.list_conversations()).conversations is not None


async def test_a_jwt_not_valid_yet_is_refused(sidecar: SidecarProcess) -> None:
    later = int(time.time()) + 600
    error = await refusal(sidecar.target, token=SIGNER.sign(nbf=later, exp=later + 300))
    assert error.reason == "TOKEN_INVALID"
    assert "not valid yet" in error.message


async def test_a_jwt_for_another_audience_is_refused(sidecar: SidecarProcess) -> None:
    error = await refusal(sidecar.target, token=SIGNER.sign(aud="some-other-service"))
    assert error.reason == "TOKEN_INVALID"
    assert f"does not include {AUDIENCE!r}" in error.message


async def test_a_jwt_from_another_issuer_is_refused(sidecar: SidecarProcess) -> None:
    error = await refusal(sidecar.target, token=SIGNER.sign(iss="https://elsewhere.test"))
    assert error.reason == "TOKEN_INVALID"
    assert "issuer (iss)" in error.message


async def test_a_jwt_with_a_bad_signature_is_refused(sidecar: SidecarProcess) -> None:
    error = await refusal(sidecar.target, token=STRANGER.sign())
    assert error.reason == "TOKEN_INVALID"
    assert "signature does not verify" in error.message
    # A valid token with its payload swapped for another tenant's keeps a signature that fails.
    header, _, signature = SIGNER.sign().split(".")
    forged_claims = json.loads(base64.urlsafe_b64decode(SIGNER.sign().split(".")[1] + "=="))
    forged_claims["tenant"] = "tenant-s"
    payload = b64(json.dumps(forged_claims).encode())
    error = await refusal(sidecar.target, token=f"{header}.{payload}.{signature}")
    assert error.reason == "TOKEN_INVALID"


async def test_unknown_key_ids_and_forbidden_algorithms_are_refused(sidecar: SidecarProcess) -> None:
    error = await refusal(sidecar.target, token=SIGNER.sign(kid="key-unknown"))
    assert error.reason == "TOKEN_INVALID"
    assert "key id (kid)" in error.message
    claims = {"iss": "https://issuer.turnwire.test", "aud": AUDIENCE, "sub": "x", "tenant": "t", "exp": 2**40}
    unsigned = jwt.encode(claims, key="", algorithm="none", headers={"kid": "key-1"})
    assert (await refusal(sidecar.target, token=unsigned)).reason == "TOKEN_INVALID"
    # HS256 keyed with the public key's JSON: the classic HS/RS confusion (built by hand, since
    # PyJWT refuses to sign with a key that looks like a JWK).
    secret = json.dumps(SIGNER.public_jwk()).encode()
    header = b64(json.dumps({"alg": "HS256", "kid": "key-1"}).encode())
    signing_input = f"{header}.{b64(json.dumps(claims).encode())}"
    confused = f"{signing_input}.{b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"
    error = await refusal(sidecar.target, token=confused)
    assert error.reason == "TOKEN_INVALID"
    assert "algorithm" in error.message


async def test_a_jwt_without_a_tenant_or_subject_is_refused(sidecar: SidecarProcess) -> None:
    error = await refusal(sidecar.target, token=SIGNER.sign(tenant=None))
    assert error.reason == "TOKEN_INVALID"
    assert "'tenant'" in error.message
    error = await refusal(sidecar.target, token=SIGNER.sign(tenant="a/b"))
    assert error.reason == "TOKEN_INVALID"
    error = await refusal(sidecar.target, token=SIGNER.sign(sub=None))
    assert error.reason == "TOKEN_INVALID"
    assert "'sub'" in error.message


async def test_valid_static_tokens_and_jwts_run_turns(sidecar: SidecarProcess) -> None:
    for token in (STATIC, SIGNER.sign(), SIGNER.sign(aud=[AUDIENCE, "another"])):
        async with TurnwireClient(sidecar.target, token=token) as client:
            result = await collect(client.chat("auth-conversation", "hello"))
            assert result.ok, result
            # Each caller has its own tenant, so each sees a conversation of one turn.
            conversation = await client.get_conversation("auth-conversation")
            assert conversation.message_count >= 2
            assert [c.conversation_id for c in (await client.list_conversations()).conversations] == [
                "auth-conversation"
            ]


async def test_the_cli_sends_the_token_from_its_option_or_variable(sidecar: SidecarProcess) -> None:
    refused = await run_turnwire("history", "cli-conversation", "--target", sidecar.target)
    assert refused.code == 2, refused
    assert "TOKEN_MISSING" in refused.stdout + refused.stderr
    chatted = await run_turnwire(
        "chat", "cli-conversation", "hello", "--target", sidecar.target, "--token", STATIC
    )
    assert chatted.code == 0, chatted
    shown = await run_turnwire(
        "history", "cli-conversation", "--target", sidecar.target, env={"TURNWIRE_TOKEN": STATIC}
    )
    assert shown.code == 0, shown
    assert "hello" in shown.stdout
    # `conversations` sends it too (its page token once took the bearer token's place), and the
    # connection options may come before the command.
    listed = await run_turnwire("--token", STATIC, "conversations", "--target", sidecar.target)
    assert listed.code == 0, listed
    assert listed.stdout.startswith("cli-conversation · "), listed
    assert (
        STATIC
        not in refused.stdout + refused.stderr + chatted.stdout + chatted.stderr + shown.stdout + shown.stderr
    )


async def test_health_and_reflection_are_open_by_default(sidecar: SidecarProcess) -> None:
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="turnwire.v1.ChatService"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for answer in reflection.ServerReflectionInfo(iter([request])):
            names = {service.name for service in answer.list_services_response.service}
            assert "turnwire.v1.ChatService" in names
            break


async def test_health_can_require_a_token(sidecar_factory: SidecarFactory, tmp_path: Path) -> None:
    token = new_token()
    tokens = write_tokens_file(tmp_path / "tokens.json", {token: ("probe", "ops")})
    sidecar = sidecar_factory({"auth": auth_config(tokens, open_health=False)})
    sidecar.health_metadata = (("authorization", f"Bearer {token}"),)
    await sidecar.start()
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_no_token_is_logged_at_debug_level(sidecar: SidecarProcess) -> None:
    expired = SIGNER.sign(exp=int(time.time()) - 3600)
    shown = [STATIC, SIGNER.sign(), expired, STRANGER.sign(), new_token()]
    for token in shown:
        async with TurnwireClient(sidecar.target, token=token) as client:
            try:
                await collect(client.chat("logged-conversation", "hello"))
                await client.get_conversation("no-such-conversation")
            except TurnwireError:
                pass
    log = sidecar.log_text()
    assert "refused /turnwire.v1.ChatService" in log, "the refusals are logged (without tokens)"
    for token in shown:
        for part in token.split("."):
            assert part not in log, "a token (or a part of one) is in the server log"


async def test_hostile_jwt_headers_are_refused_with_one_line_each(sidecar: SidecarProcess) -> None:
    # Issue 32 item 7: a numeric kid or a crit member ended UNKNOWN with a 26-line traceback each.
    headers: list[dict[str, Any]] = [
        {"alg": "ES256", "kid": 7},
        {"alg": "ES256", "kid": ["key-1"]},
        {"alg": "ES256", "kid": "key-1", "crit": ["exp"]},
        {"alg": "ES256", "kid": "key-1", "crit": []},
        {"alg": 256, "kid": "key-1"},
    ]

    def own_lines() -> int:  # gRPC's own DEBUG lines ("Loaded running loop") are not ours to count
        return sum(" turnwire." in line for line in sidecar.log_text().splitlines())

    before = own_lines()
    for header in headers:
        for _ in range(20):
            error = await refusal(sidecar.target, token=signed(SIGNER, header, valid_claims()))
            assert error.reason == "TOKEN_INVALID", error
    numeric_kid = await refusal(sidecar.target, token=signed(SIGNER, headers[0], valid_claims()))
    assert "key id (kid) must be a string" in numeric_kid.message
    critical = await refusal(sidecar.target, token=signed(SIGNER, headers[2], valid_claims()))
    assert "(crit)" in critical.message
    # Large values, up to gRPC's 8 KiB metadata limit (past it gRPC refuses the call itself).
    huge = signed(SIGNER, {"alg": "ES256", "kid": "key-1"}, {**valid_claims(), "exp": "9" * 5000})
    assert (await refusal(sidecar.target, token=huge)).reason == "TOKEN_INVALID"
    log = sidecar.log_text()
    assert "Traceback" not in log
    # At debug level each refusal is one line (the throttled WARNING folds them at other levels).
    calls = len(headers) * 20 + 3
    assert own_lines() - before <= calls + 1


async def test_sighup_reloads_the_tokens_file_and_the_key_set(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    # Issue 32 item 8: the sources were read only at start, so a revoked token kept working.
    revoked, kept, added = new_token(), new_token(), new_token()
    old_key, new_key = Issuer("key-old"), Issuer("key-new")
    tokens = write_tokens_file(tmp_path / "tokens.json", {revoked: ("leaver", "t"), kept: ("stayer", "t")})
    jwks = write_jwks(tmp_path / "jwks.json", old_key)
    sidecar = await sidecar_factory({"auth": auth_config(tokens, jwks)}).start()

    async def accepted(token: str) -> bool:
        async with TurnwireClient(sidecar.target, token=token) as client:
            try:
                await client.list_conversations()
            except TurnwireError as error:
                assert error.code == grpc.StatusCode.UNAUTHENTICATED, error
                return False
        return True

    assert await accepted(revoked) and await accepted(old_key.sign())
    assert not await accepted(added) and not await accepted(new_key.sign())
    write_tokens_file(tokens, {kept: ("stayer", "t"), added: ("joiner", "t")})
    write_jwks(jwks, new_key)
    # A file written while the sidecar runs is not read until the SIGHUP.
    assert await accepted(revoked)
    sidecar.send_signal(signal.SIGHUP)
    await wait_until(
        lambda: "auth: token sources reloaded (SIGHUP)" in sidecar.log_text(), timeout=10, what="the reload"
    )
    assert not await accepted(revoked)
    assert not await accepted(old_key.sign())
    assert await accepted(kept) and await accepted(added) and await accepted(new_key.sign())
    # A broken replacement is refused and the sources in use stay.
    tokens.write_text('{"tokens": [{"sha256": "not-hex"', encoding="utf-8")
    sidecar.send_signal(signal.SIGHUP)
    await wait_until(
        lambda: "token sources not reloaded, still using the previous ones" in sidecar.log_text(),
        timeout=10,
        what="the refused reload",
    )
    assert await accepted(added) and not await accepted(revoked)
    assert added not in sidecar.log_text()
