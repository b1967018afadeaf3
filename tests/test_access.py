"""In-process checks of the access layer's parts: configuration errors at start, token files,
and the tenant prefix taken off what goes back to a client (api/tenancy.py). The behaviour
through a real server is in tests/e2e/test_auth_e2e.py, test_tenancy_e2e.py and
test_rate_limits_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from support.tokens import Issuer, new_token, write_jwks

from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.access_settings import RateLimit
from turnwire_server.api.authentication import Authenticator, AuthError, StaticTokens, token_digest
from turnwire_server.api.caller import Caller
from turnwire_server.api.status import TurnwireStatusError
from turnwire_server.api.tenancy import Tenancy
from turnwire_server.assembly import StartupError, build_access
from turnwire_server.config import ConfigError, load_settings


def test_auth_needs_a_token_source() -> None:
    with pytest.raises(ConfigError, match=r"auth\.enabled needs tokens_file, tokens_env or jwt"):
        load_settings(auth={"enabled": True})
    with pytest.raises(ConfigError, match="algorithms"):
        load_settings(
            auth={
                "enabled": True,
                "jwt": {"jwks_file": "k", "issuer": "i", "audience": "a", "algorithms": ["HS256"]},
            }
        )


def test_unusable_token_sources_stop_the_start(tmp_path: Path) -> None:
    missing = load_settings(auth={"enabled": True, "tokens_file": str(tmp_path / "absent.yaml")})
    with pytest.raises(StartupError, match=r"auth.tokens_file .*absent.yaml"):
        build_access(missing)
    unset = load_settings(auth={"enabled": True, "tokens_env": "TURNWIRE_TEST_NO_SUCH_VARIABLE"})
    with pytest.raises(StartupError, match="TURNWIRE_TEST_NO_SUCH_VARIABLE is not set"):
        build_access(unset)
    secret_keys = tmp_path / "jwks.json"
    secret_keys.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "hs"}]}))
    symmetric = load_settings(
        auth={"enabled": True, "jwt": {"jwks_file": str(secret_keys), "issuer": "i", "audience": "a"}}
    )
    with pytest.raises(StartupError, match="public keys only"):
        build_access(symmetric)


def test_a_bad_tokens_file_names_the_entry_but_never_the_token() -> None:
    token = new_token()
    document = json.dumps({"tokens": [{"token": token, "principal": "p", "tenant": "bad/tenant"}]})
    with pytest.raises(Exception, match=r"tokens\.0\.tenant") as raised:
        StaticTokens.parse(document, "a test")
    assert token not in str(raised.value)


def test_static_tokens_by_digest_or_plain() -> None:
    hashed, plain = new_token(), new_token()
    document = (
        f"tokens:\n"
        f"  - {{sha256: {token_digest(hashed)}, principal: alice, tenant: acme}}\n"
        f"  - {{token: {plain}, principal: bob, tenant: other}}\n"
    )
    tokens = StaticTokens.parse(document, "a test")
    assert tokens.lookup(hashed) == Caller("alice", "acme")
    assert tokens.lookup(plain) == Caller("bob", "other")
    assert tokens.lookup(new_token()) is None


def test_static_tokens_from_the_environment(tmp_path: Path) -> None:
    token = new_token()
    issuer = Issuer("k")
    settings = load_settings(
        auth={
            "enabled": True,
            "tokens_env": "TOKENS",
            "jwt": {
                "jwks_file": str(write_jwks(tmp_path / "jwks.json", issuer)),
                "issuer": "i",
                "audience": "a",
            },
        }
    )
    document = json.dumps({"tokens": [{"sha256": token_digest(token), "principal": "env", "tenant": "t"}]})
    authenticator = Authenticator.from_settings(settings.auth, {"TOKENS": document})
    assert authenticator.authenticate([("authorization", f"Bearer {token}")]) == Caller("env", "t")
    with pytest.raises(AuthError) as raised:
        authenticator.authenticate(
            [("authorization", f"Bearer {token}"), ("authorization", f"Bearer {token}")]
        )
    assert raised.value.reason == "TOKEN_INVALID"


def test_unscope_takes_the_prefix_off_ids_and_statuses() -> None:
    tenancy = Tenancy("acme")
    error = TurnwireStatusError(
        grpc.StatusCode.NOT_FOUND,
        "conversation 'acme/c1' does not exist (not 'xacme/c1', not 'acme-2/c1')",
        reason="CONVERSATION_NOT_FOUND",
        field_violations=[("request_id", "'acme/r1' is taken")],
        metadata={"conversation_id": "acme/c1", "request_id": "acme/r1"},
    )
    event = event_pb2.TurnEvent(conversation_id="acme/c1", request_id="acme/r1", sequence_number=3)
    event.turn_end.error.CopyFrom(error.to_status())
    response = chat_service_pb2.ChatResponse(event=event)
    tenancy.unscope(response)
    assert (response.event.conversation_id, response.event.request_id) == ("c1", "r1")
    status = response.event.turn_end.error
    assert status.message == "conversation 'c1' does not exist (not 'xacme/c1', not 'acme-2/c1')"
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    status.details[0].Unpack(info)
    status.details[1].Unpack(bad)
    assert dict(info.metadata) == {"conversation_id": "c1", "request_id": "r1"}
    assert bad.field_violations[0].description == "'r1' is taken"

    listing = chat_service_pb2.ListSubmissionsResponse(
        submissions=[chat_service_pb2.Submission(submission_id="acme/s1", conversation_id="acme/c1")]
    )
    tenancy.unscope(listing)
    assert [(s.submission_id, s.conversation_id) for s in listing.submissions] == [("s1", "c1")]


def test_rate_limit_overrides_name_a_principal_of_one_tenant() -> None:
    settings = load_settings(
        rate_limits={
            "turns_per_minute": 2,
            "tenants": {"acme": {"turns_per_minute": 5, "principals": {"svc": {"turns_per_minute": 9}}}},
        }
    ).rate_limits
    assert settings.for_caller("svc", "acme").turns_per_minute == 9
    assert settings.for_caller("other", "acme").turns_per_minute == 5
    assert settings.for_caller("svc", "globex").turns_per_minute == 2  # another tenant's `svc`
    # A limit an entry does not give is the one above it.
    layered = load_settings(
        rate_limits={
            "turns_per_minute": 2,
            "tokens_per_minute": 100,
            "tenants": {"acme": {"principals": {"svc": {"tokens_per_minute": 7}}}},
        }
    ).rate_limits
    assert layered.for_caller("svc", "acme") == RateLimit(turns_per_minute=2, tokens_per_minute=7)
    assert layered.for_caller("other", "acme") == RateLimit(turns_per_minute=2, tokens_per_minute=100)
    # The old top-level `principals:` applied to every tenant's principal of that name: refused,
    # saying where each entry goes now.
    with pytest.raises(ConfigError) as refused:
        load_settings(rate_limits={"principals": {"svc": {"turns_per_minute": 9}}})
    assert "rate_limits: rate_limits.principals is no longer read" in str(refused.value)
    assert "rate_limits.tenants.<tenant>.principals.<principal> (entries given: svc)" in str(refused.value)


def test_tenant_shares_per_tenant() -> None:
    shares = load_settings(
        limits={"max_concurrent_rpcs": 10}, tenant_shares={"tenants": {"acme": {"turn_calls": 0.1}}}
    ).tenant_shares
    assert shares.for_tenant("globex").calls(10) == (5, 5)  # the default: half each
    assert shares.for_tenant("acme").calls(10) == (1, 5)
    assert shares.for_tenant("acme").calls(3) == (1, 1)  # never none
    # Turn calls are streams too: a turn-call share above the streams share could never be reached.
    with pytest.raises(
        ConfigError, match=r"tenant_shares\.tenants\.acme: turn_calls \(0\.8\) is above streams"
    ):
        load_settings(tenant_shares={"tenants": {"acme": {"turn_calls": 0.8}}})
