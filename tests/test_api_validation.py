"""``turnwire_server.api.validation`` on its own: ids, messages, size limits, and the error raised.

Every violation is a ``(field, description)`` pair: the field names where the
problem is, and the description says what to fix.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.rpc import error_details_pb2

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api.status import TurnwireStatusError
from turnwire_server.api.validation import ID_PATTERN, check_budget, check_id, check_message, raise_if_any
from turnwire_server.engine.budget_settings import BudgetLimit
from turnwire_server.engine.ids import RESERVED_PREFIX, is_reserved

Violations = list[tuple[str, str]]
VALID_CHARS = "[A-Za-z0-9._:-]"


def id_violations(value: str, *, required: bool = True, client_chosen: bool = False) -> Violations:
    violations: Violations = []
    check_id(value, "request_id", violations, required=required, client_chosen=client_chosen)
    return violations


def text_message(
    text: str = "hello", *, message_id: str = "", role: message_pb2.Role.ValueType = message_pb2.ROLE_USER
) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = text
    return message


def message_violations(
    message: message_pb2.Message,
    *,
    max_bytes: int = 10_000,
    default_role: int | None = message_pb2.ROLE_USER,
    field: str = "message",
) -> Violations:
    violations: Violations = []
    check_message(message, field, violations, max_bytes=max_bytes, default_role=default_role)
    return violations


# --------------------------------------------------------------------------- ids


@pytest.mark.parametrize(
    "value",
    ["a", "conv-1", "req_2.b:c", "A" * 128, "0123456789", "tw-is-fine-when-not-client-chosen"],
)
def test_valid_ids_pass(value: str) -> None:
    assert id_violations(value) == []
    assert ID_PATTERN.fullmatch(value)


@pytest.mark.parametrize(
    "value",
    ["a b", "a/b", "é", "conv\n", "\nconv", "tab\there", "semi;colon", "ünïcode"],
)
def test_invalid_ids_name_the_field_and_the_allowed_characters(value: str) -> None:
    [(field, description)] = id_violations(value)
    assert field == "request_id"
    assert description == f"{value!r} is not a valid id; use 1-128 characters of {VALID_CHARS}"


# Every id the API checks, checked the way its RPC checks it (see ChatService): (field, check).
ID_CHECKS: dict[str, Callable[[str, Violations], None]] = {
    "conversation_id": lambda value, violations: check_id(
        value, "conversation_id", violations, required=True
    ),
    "request_id": lambda value, violations: check_id(
        value, "request_id", violations, required=False, client_chosen=True
    ),
    "message.id": lambda value, violations: check_message(
        text_message(message_id=value), "message", violations, max_bytes=10_000, default_role=None
    ),
    "CancelChat.request_id": lambda value, violations: check_id(
        value, "request_id", violations, required=True
    ),
}


@pytest.mark.parametrize("check", ID_CHECKS.values(), ids=ID_CHECKS.keys())
@pytest.mark.parametrize("value", ["conv-1\n", "conv-1\r\n", "\nconv-1", "conv\n-1", "conv-1 "])
def test_every_id_must_match_as_a_whole_so_a_trailing_newline_is_refused(
    check: Callable[[str, Violations], None], value: str
) -> None:
    # re.match with "$" would accept "conv-1\n": "$" also matches before a final newline.
    violations: Violations = []
    check(value, violations)
    [(field, description)] = violations
    assert field.endswith("id")
    assert description.startswith(f"{value!r} is not a valid id")
    without: Violations = []
    check("conv-1", without)  # the same id without the stray character passes
    assert without == []


def test_the_id_pattern_is_used_with_fullmatch() -> None:
    assert ID_PATTERN.match("conv-1\n")  # a prefix matches ...
    assert not ID_PATTERN.fullmatch("conv-1\n")  # ... the whole value does not
    assert id_violations("conv-1\n") != []


def test_an_id_longer_than_128_characters_is_refused() -> None:
    assert id_violations("a" * 128) == []
    [(field, description)] = id_violations("a" * 129)
    assert field == "request_id"
    assert description.endswith(f"is not a valid id; use 1-128 characters of {VALID_CHARS}")


def test_a_long_invalid_id_is_shown_cut_to_40_characters() -> None:
    value = "x" * 60 + " y"
    [(_, description)] = id_violations(value)
    assert description.startswith(repr("x" * 40 + "…") + " is not a valid id")
    assert "x" * 41 not in description


def test_an_empty_id_is_a_violation_only_when_required() -> None:
    assert id_violations("", required=True) == [
        ("request_id", f"must not be empty; give 1-128 characters of {VALID_CHARS}")
    ]
    assert id_violations("", required=False) == []


def test_client_chosen_ids_may_not_use_the_servers_reserved_prefix() -> None:
    reserved = f"{RESERVED_PREFIX}r-mine"
    assert is_reserved(reserved)
    assert id_violations(reserved, client_chosen=True) == [
        (
            "request_id",
            f"ids starting with {RESERVED_PREFIX!r} are reserved for ids the server assigns; "
            "choose another id or leave it empty",
        )
    ]
    # An id that refers to something existing (CancelChat) may be the server's.
    assert id_violations(reserved, client_chosen=False) == []
    # Only the prefix is reserved.
    assert id_violations("my-tw-id", client_chosen=True) == []


def test_an_invalid_reserved_id_gets_one_violation_the_format_one() -> None:
    [(_, description)] = id_violations(f"{RESERVED_PREFIX}bad id", client_chosen=True)
    assert "is not a valid id" in description


def test_violations_are_appended_to_the_callers_list() -> None:
    violations: Violations = [("earlier", "kept")]
    check_id("", "conversation_id", violations, required=True)
    check_id("ok", "request_id", violations, required=False)
    assert [field for field, _ in violations] == ["earlier", "conversation_id"]


# --------------------------------------------------------------------------- messages


def test_a_valid_message_gets_a_server_id_its_default_role_and_no_create_time() -> None:
    message = text_message(role=message_pb2.ROLE_UNSPECIFIED)
    message.create_time.seconds = 1_700_000_000
    assert message_violations(message, default_role=message_pb2.ROLE_USER) == []
    assert message.role == message_pb2.ROLE_USER
    assert message.id and ID_PATTERN.fullmatch(message.id)
    assert is_reserved(message.id)  # in the server's namespace, so it never collides with a client's
    assert not message.HasField("create_time")  # output only: set when stored
    again = text_message()
    message_violations(again)
    assert again.id != message.id


def test_a_client_message_id_is_kept() -> None:
    message = text_message(message_id="m-1", role=message_pb2.ROLE_ASSISTANT)
    assert message_violations(message, default_role=None) == []
    assert (message.id, message.role) == ("m-1", message_pb2.ROLE_ASSISTANT)


@pytest.mark.parametrize("role", [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT, message_pb2.ROLE_SYSTEM])
def test_every_known_role_is_accepted(role: message_pb2.Role.ValueType) -> None:
    assert message_violations(text_message(role=role), default_role=None) == []


def test_all_problems_of_a_message_are_reported_at_once() -> None:
    message = message_pb2.Message(id="bad id")
    message.parts.add()  # no content
    message.parts.add().text.text = "x" * 200
    violations = message_violations(message, max_bytes=100, default_role=None, field="messages[2]")
    assert [field for field, _ in violations] == [
        "messages[2].role",
        "messages[2].parts[0]",
        "messages[2]",
        "messages[2].id",
    ]


@pytest.mark.parametrize(
    "role", [message_pb2.ROLE_USER, message_pb2.ROLE_SYSTEM, message_pb2.ROLE_UNSPECIFIED]
)
@pytest.mark.parametrize("texts", [[""], [" \n\t"], ["", "  "]])
def test_a_user_or_system_message_of_blank_text_only_is_refused(
    role: message_pb2.Role.ValueType, texts: list[str]
) -> None:
    message = message_pb2.Message(role=role)
    for text in texts:
        message.parts.add().text.text = text
    assert message_violations(message) == [
        ("message.parts", "the message has no content: its text is empty; send some text or another part")
    ]


def test_blank_text_beside_other_content_and_a_blank_assistant_reply_are_kept() -> None:
    with_data = text_message("")
    with_data.parts.add().data.type = "selection"
    assert message_violations(with_data) == []
    assert message_violations(text_message(" ", role=message_pb2.ROLE_ASSISTANT), default_role=None) == []


# --------------------------------------------------------------------------- size limits


def test_the_size_limit_is_inclusive_and_counts_the_message_as_sent() -> None:
    message = text_message("x" * 50, message_id="m-1")
    size = message.ByteSize()
    assert message_violations(text_message("x" * 50, message_id="m-1"), max_bytes=size) == []
    [(field, description)] = message_violations(
        text_message("x" * 50, message_id="m-1"), max_bytes=size - 1, field="messages[0]"
    )
    assert field == "messages[0]"
    assert description == f"is {size:,} bytes; the limit is {size - 1:,} bytes (limits.max_message_bytes)"


def test_the_server_assigned_id_does_not_count_towards_the_size() -> None:
    message = text_message("x" * 50)  # no id: the server assigns one after the check
    size = message.ByteSize()
    assert message_violations(message, max_bytes=size) == []
    assert message.ByteSize() > size


def test_sizes_are_shown_with_thousands_separators() -> None:
    message = text_message("x" * 5_000, message_id="m-1")
    [(_, description)] = message_violations(message, max_bytes=1_000)
    assert f"is {message.ByteSize():,} bytes; the limit is 1,000 bytes" in description


# --------------------------------------------------------------------------- every violation says what to fix


def _empty_required_id(violations: Violations) -> None:
    check_id("", "conversation_id", violations, required=True)


def _bad_id(violations: Violations) -> None:
    check_id("a b", "conversation_id", violations, required=True)


def _reserved_id(violations: Violations) -> None:
    check_id(f"{RESERVED_PREFIX}x", "request_id", violations, required=False, client_chosen=True)


def _unset_role(violations: Violations) -> None:
    check_message(
        text_message(role=message_pb2.ROLE_UNSPECIFIED),
        "messages[0]",
        violations,
        max_bytes=1000,
        default_role=None,
    )


def _unknown_role(violations: Violations) -> None:
    message = text_message()
    message.role = 7  # type: ignore[assignment]
    check_message(message, "messages[0]", violations, max_bytes=1000, default_role=None)


def _no_parts(violations: Violations) -> None:
    check_message(
        message_pb2.Message(role=message_pb2.ROLE_USER),
        "message",
        violations,
        max_bytes=1000,
        default_role=None,
    )


def _empty_part(violations: Violations) -> None:
    message = text_message()
    message.parts.add()
    check_message(message, "message", violations, max_bytes=1000, default_role=None)


def _too_large(violations: Violations) -> None:
    check_message(text_message("x" * 100), "message", violations, max_bytes=10, default_role=None)


def _bad_message_id(violations: Violations) -> None:
    check_message(text_message(message_id="m/1"), "message", violations, max_bytes=1000, default_role=None)


def _reserved_message_id(violations: Violations) -> None:
    check_message(
        text_message(message_id=f"{RESERVED_PREFIX}a-r1"),
        "message",
        violations,
        max_bytes=1000,
        default_role=None,
    )


# (make the violation, the field it must name, words that say what to do about it)
FIX_CASES: list[tuple[Callable[[Violations], None], str, tuple[str, ...]]] = [
    (_empty_required_id, "conversation_id", ("must not be empty", "give 1-128 characters", VALID_CHARS)),
    (_bad_id, "conversation_id", ("not a valid id", "use 1-128 characters", VALID_CHARS)),
    (_reserved_id, "request_id", ("reserved", "choose another id or leave it empty")),
    (_unset_role, "messages[0].role", ("must be set", "ROLE_USER", "ROLE_ASSISTANT", "ROLE_SYSTEM")),
    (_unknown_role, "messages[0].role", ("7", "ROLE_USER", "ROLE_ASSISTANT", "ROLE_SYSTEM")),
    (_no_parts, "message.parts", ("must contain at least one part", "text part")),
    (_empty_part, "message.parts[1]", ("has no content", "set one of text")),
    (_too_large, "message", ("the limit is 10 bytes", "limits.max_message_bytes")),
    (_bad_message_id, "message.id", ("not a valid id", "use 1-128 characters", VALID_CHARS)),
    (_reserved_message_id, "message.id", ("reserved", "choose another id or leave it empty")),
]


@pytest.mark.parametrize(
    ("make", "field", "fix"),
    [pytest.param(*case, id=case[0].__name__.strip("_")) for case in FIX_CASES],
)
def test_every_violation_names_its_field_and_says_what_to_fix(
    make: Callable[[Violations], None], field: str, fix: tuple[str, ...]
) -> None:
    violations: Violations = []
    make(violations)
    assert [f for f, _ in violations] == [field], violations
    [(_, description)] = violations
    missing = [words for words in fix if words not in description]
    assert not missing, f"{field}: {description!r} does not say {missing}"


# --------------------------------------------------------------------------- the error raised


def test_no_violations_raise_nothing() -> None:
    raise_if_any([])


def test_violations_raise_invalid_argument_listing_every_field() -> None:
    violations: Violations = []
    check_id("", "conversation_id", violations, required=True)
    _too_large(violations)
    with pytest.raises(TurnwireStatusError) as raised:
        raise_if_any(violations)
    error = raised.value
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason == "INVALID_FIELD"  # not only the size is wrong
    assert error.field_violations == tuple(violations)
    assert error.message == "; ".join(f"{field}: {description}" for field, description in violations)
    status = error.to_status()
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    bad_request = error_details_pb2.BadRequest()
    assert any(detail.Unpack(bad_request) for detail in status.details if detail.Is(bad_request.DESCRIPTOR))
    assert [(v.field, v.description) for v in bad_request.field_violations] == violations


def test_only_size_violations_are_message_too_large() -> None:
    violations: Violations = []
    _too_large(violations)
    check_message(text_message("y" * 100), "messages[1]", violations, max_bytes=10, default_role=None)
    assert len(violations) == 2
    with pytest.raises(TurnwireStatusError) as raised:
        raise_if_any(violations)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.reason == "MESSAGE_TOO_LARGE"


def test_a_requests_own_budget_is_checked_and_read() -> None:
    """docs/cost.md, "Budgets": TurnBudget lowers the turn's budget; unset fields leave it."""
    violations: Violations = []
    unset = chat_service_pb2.ChatRequest()
    assert check_budget(unset, violations) is None
    request = chat_service_pb2.ChatRequest(budget=chat_service_pb2.TurnBudget(max_usd=0.5))
    assert check_budget(request, violations) == BudgetLimit(usd=0.5)
    assert violations == []
    bad = chat_service_pb2.ChatRequest(budget=chat_service_pb2.TurnBudget(max_tokens=0, max_usd=float("nan")))
    check_budget(bad, violations)
    assert [field for field, _ in violations] == ["budget.max_tokens", "budget.max_usd"]
