"""Request validation: every problem becomes a BadRequest field violation saying what to fix.

Runs before anything is stored, so a rejected request changes nothing
(docs/semantics.md §2, admission).
"""

from __future__ import annotations

import math
import re
from typing import Any

from google.protobuf import struct_pb2

from turnwire.values import NotJsonError, from_struct, normalize
from turnwire_client.v1 import message_pb2
from turnwire_server.api.status import TurnwireStatusError, invalid_argument
from turnwire_server.api.tenancy import SCOPED_FIELDS, local_id
from turnwire_server.engine.budget_settings import BudgetLimit
from turnwire_server.engine.ids import RESERVED_PREFIX, is_reserved, new_message_id

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""Conversation, request and message ids: 1-128 of letters, digits, ``.``, ``_``, ``:``, ``-``
(matched against the whole value: ``fullmatch``, so a trailing newline is refused too)."""

_ROLE_NAMES = {
    message_pb2.ROLE_USER: "ROLE_USER",
    message_pb2.ROLE_ASSISTANT: "ROLE_ASSISTANT",
    message_pb2.ROLE_SYSTEM: "ROLE_SYSTEM",
}
_ROLE_CHOICES = ", ".join(list(_ROLE_NAMES.values())[:-1]) + " or " + list(_ROLE_NAMES.values())[-1]
"""The roles a client may set, for violations to name: ``ROLE_USER, ROLE_ASSISTANT or ROLE_SYSTEM``."""


def check_id(
    value: str,
    field: str,
    violations: list[tuple[str, str]],
    *,
    required: bool,
    client_chosen: bool = False,
) -> None:
    """Add a violation when ``value`` is not a valid id (or is empty and ``required``).

    ``client_chosen``: the id names something new the client creates (a request id, an input
    message id), so the server's reserved namespace (``tw-``, see
    :mod:`turnwire_server.engine.ids`) is refused; ids that refer to existing things
    (``CancelChat.request_id``) may be the server's. A field named in
    :data:`~turnwire_server.api.tenancy.SCOPED_FIELDS` holds a tenant-scoped key: its client id
    (:func:`~turnwire_server.api.tenancy.local_id`) is what is checked and quoted.
    """
    if field in SCOPED_FIELDS:
        value = local_id(value)  # the client's id (api/tenancy.py scoped it on the way in)
    if not value:
        if required:
            violations.append((field, "must not be empty; give 1-128 characters of [A-Za-z0-9._:-]"))
        return
    if not ID_PATTERN.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "…"
        violations.append((field, f"{shown!r} is not a valid id; use 1-128 characters of [A-Za-z0-9._:-]"))
    elif client_chosen and is_reserved(value):
        violations.append(
            (
                field,
                f"ids starting with {RESERVED_PREFIX!r} are reserved for ids the server assigns; "
                "choose another id or leave it empty",
            )
        )


def check_text(value: str, field: str, violations: list[tuple[str, str]]) -> None:
    """Add a violation when ``value``, a client string the store keeps in a text column (an
    idempotency key), holds the NUL character: PostgreSQL's ``text`` cannot hold it, and both
    stores refuse it alike (docs/limits.md)."""
    if "\x00" in value:
        violations.append((field, "must not contain the NUL character (U+0000)"))


def check_message(
    message: message_pb2.Message,
    field: str,
    violations: list[tuple[str, str]],
    *,
    max_bytes: int,
    default_role: int | None,
    client_chosen_id: bool = True,
) -> None:
    """Validate one input message in place: role, parts, id and size.

    A user or system message whose parts are all blank text (empty or whitespace) is refused: it
    has nothing for a model to answer (docs/semantics.md §1).

    ``default_role`` fills an unset role (Chat: user); when None an unset role
    is a violation. ``client_chosen_id`` False lets the id be one of the server's (``tw-``):
    for AddMessages' upsert, which may replace a stored message but never add one under such
    an id (the store enforces that). Assigns an id when empty and clears output-only fields.
    """
    if message.role == message_pb2.ROLE_UNSPECIFIED:
        if default_role is None:
            violations.append((f"{field}.role", f"must be set ({_ROLE_CHOICES})"))
        else:
            message.role = default_role  # type: ignore[assignment]
    elif message.role not in _ROLE_NAMES:
        violations.append((f"{field}.role", f"unknown role {message.role}; use {_ROLE_CHOICES}"))
    if not message.parts:
        violations.append((f"{field}.parts", "must contain at least one part (for example a text part)"))
    for index, part in enumerate(message.parts):
        if part.WhichOneof("kind") is None:
            violations.append((f"{field}.parts[{index}]", "has no content; set one of text, file, data, …"))
    if message.role != message_pb2.ROLE_ASSISTANT and message.parts and all(_blank(p) for p in message.parts):
        # A user or system message of blank text only would be stored and run a turn on nothing
        # (a fresh-user trial: `turnwire chat conv ""`). Assistant messages keep blank text: a
        # stored reply can be empty (a cut turn), and AddMessages copies transcripts as they are.
        violations.append(
            (
                f"{field}.parts",
                "the message has no content: its text is empty; send some text or another part",
            )
        )
    size = message.ByteSize()
    if size > max_bytes:
        violations.append(
            (
                field,
                f"is {size:,} bytes; the limit is {max_bytes:,} bytes (limits.max_message_bytes)",
            )
        )
    check_id(message.id, f"{field}.id", violations, required=False, client_chosen=client_chosen_id)
    if not message.id:
        message.id = new_message_id()
    message.ClearField("create_time")  # output only: the server sets it when storing


def _blank(part: message_pb2.Part) -> bool:
    """Whether ``part`` is a text part of whitespace only (or empty)."""
    return part.WhichOneof("kind") == "text" and not part.text.text.strip()


def raise_if_any(violations: list[tuple[str, str]]) -> None:
    """Raise INVALID_ARGUMENT listing all ``violations`` (MESSAGE_TOO_LARGE when only size is wrong)."""
    if not violations:
        return
    reason = (
        "MESSAGE_TOO_LARGE"
        if all("limits.max_message_bytes" in description for _, description in violations)
        else "INVALID_FIELD"
    )
    error: TurnwireStatusError = invalid_argument(violations, reason=reason)
    raise error


def json_object(value: struct_pb2.Struct, field: str) -> dict[str, Any]:
    """A request's ``Struct`` field (``body``, ``metadata``) as plain JSON for hooks and the store.

    Raises INVALID_ARGUMENT naming the path (``body.a[2]``) for a number JSON has no form for
    (NaN, Infinity).
    """
    if not value.ByteSize():
        return {}
    try:
        return normalize(from_struct(value))  # type: ignore[no-any-return]
    except NotJsonError as error:
        path = field + error.path.removeprefix("$")
        raise invalid_argument([(path, "NaN and Infinity have no JSON form; send a finite number")]) from None


def check_budget(request: Any, violations: list[tuple[str, str]]) -> BudgetLimit | None:
    """The request's own turn budget (its ``budget`` field, a ``TurnBudget``), or None when it
    sets none; a ``max_tokens`` below 1 or a ``max_usd`` below 0 (or not finite) is a violation
    of ``budget.max_tokens`` / ``budget.max_usd`` (docs/cost.md, "Budgets")."""
    if not request.HasField("budget"):
        return None
    budget = request.budget
    tokens = budget.max_tokens if budget.HasField("max_tokens") else None
    usd = budget.max_usd if budget.HasField("max_usd") else None
    if tokens is not None and tokens < 1:
        violations.append(("budget.max_tokens", "must be at least 1 (unset: the configured budget)"))
    if usd is not None and not (0 <= usd < math.inf):
        violations.append(("budget.max_usd", "must be a finite number of US dollars, at least 0"))
    if tokens is None and usd is None:
        return None
    return BudgetLimit.model_construct(tokens=tokens, usd=usd)
