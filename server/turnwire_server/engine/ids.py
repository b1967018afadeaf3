"""Ids the server assigns, in a namespace no client-chosen id can enter.

docs/semantics.md §5 (Decision: server-assigned ids never collide with
client-chosen ones). Every id the server makes starts with
:data:`RESERVED_PREFIX`; the API refuses client-chosen request and message ids
with that prefix, so a client's message can never take (and overwrite) the id
of a stored assistant message, and the other way round. The kinds are
disjoint too: ``tw-r-`` request ids, ``tw-u-`` input message ids, ``tw-c-`` conversation ids
(a fork's), ``tw-a-``
assistant message ids (``tw-a<n>-`` for attempt ``n`` of a turn run again after an overflow).
"""

from __future__ import annotations

import hashlib
import re
import uuid

RESERVED_PREFIX = "tw-"
"""Ids starting with this are the server's; clients may refer to them but never choose them."""

_MAX_ID_LENGTH = 128


def new_request_id() -> str:
    """A fresh request id, for a request that came without one."""
    return f"{RESERVED_PREFIX}r-{uuid.uuid4().hex}"


def new_message_id() -> str:
    """A fresh message id, for an input message that came without one."""
    return f"{RESERVED_PREFIX}u-{uuid.uuid4().hex}"


def new_conversation_id() -> str:
    """A fresh conversation id, for a fork that came without one (docs/forks.md)."""
    return f"{RESERVED_PREFIX}c-{uuid.uuid4().hex}"


_APPROVAL_ID = re.compile(rf"{RESERVED_PREFIX}ap-[0-9a-f]{{32}}\.(.+)")


def new_approval_id(request_id: str) -> str:
    """A fresh id for a tool call's approval request (``ToolCallApproval.id``) asked by turn
    ``request_id``: ``tw-ap-<32 hex>.<request id>`` (the request id without a tenant's scope, as
    :func:`assistant_message_id` takes it), so the id names the turn whose events and reply hold
    the request (:func:`approval_turn`; the OpenAI door resolves an ``item_reference`` to it);
    ``tw-ap-<32 hex>`` when that would not fit 128 characters."""
    fresh = f"{RESERVED_PREFIX}ap-{uuid.uuid4().hex}"
    named = f"{fresh}.{request_id.rpartition('/')[2]}"
    return named if len(named) <= _MAX_ID_LENGTH else fresh


def approval_turn(approval_id: str) -> str | None:
    """The request id of the turn that asked approval ``approval_id`` (:func:`new_approval_id`);
    None for an id that names none (one too long to hold it, one an older sidecar made, or not an
    approval id)."""
    matched = _APPROVAL_ID.fullmatch(approval_id)
    return matched.group(1) if matched else None


def assistant_message_id(request_id: str) -> str:
    """The id of the assistant message a turn writes: ``tw-a-<request_id>``, or a digest of a
    request id too long to fit 128 characters. Deterministic, so a turn's reply id follows from
    its request id. A request id stored under a scope (``<scope>/<id>``: the API's tenant
    scoping, api/tenancy.py) gives the reply id of its ``<id>``: message ids are per conversation,
    and the scope stays out of what the client sees."""
    request_id = request_id.rpartition("/")[2]
    # A request id the server made (tw-r-<hex>) gives tw-a-<hex>: both are the server's, no clash.
    candidate = f"{RESERVED_PREFIX}a-{request_id.removeprefix(f'{RESERVED_PREFIX}r-')}"
    if len(candidate) <= _MAX_ID_LENGTH:
        return candidate
    return f"{RESERVED_PREFIX}a-{hashlib.sha256(request_id.encode()).hexdigest()}"


def attempt_message_id(request_id: str, attempt: int) -> str:
    """The reply id of ``attempt`` (from 1) of a turn that runs again from scratch (after a
    context overflow, docs/semantics.md §9): :func:`assistant_message_id` for attempt 1, else
    ``tw-a<attempt>-…``, a kind of its own, so no attempt's id is another turn's."""
    first = assistant_message_id(request_id)
    if attempt <= 1:
        return first
    candidate = f"{RESERVED_PREFIX}a{attempt}-{first.removeprefix(f'{RESERVED_PREFIX}a-')}"
    if len(candidate) <= _MAX_ID_LENGTH:
        return candidate
    return f"{RESERVED_PREFIX}a{attempt}-{hashlib.sha256(first.encode()).hexdigest()}"


def is_reserved(value: str) -> bool:
    """True for an id in the server's namespace."""
    return value.startswith(RESERVED_PREFIX)


def submission_message_id(submission_id: str, index: int) -> str:
    """The id of message ``index`` of submission ``submission_id`` when the client gave none:
    derived from the submission, so a submission run again after a restart stores the same ids
    (and so never stores its messages twice)."""
    digest = hashlib.sha256(submission_id.encode()).hexdigest()[:32]
    return f"{RESERVED_PREFIX}u-{digest}-{index}"


def conversation_cache_key(conversation_id: str) -> str:
    """The opaque key of conversation ``conversation_id`` (its key as stored, the tenant's prefix
    included when authentication is on) that steps give a provider's prompt cache
    (``ModelRequest.cache_key``; docs/providers.md, "Prompt caching"): 32 hex digits of its
    SHA-256, the same on every step, turn and replica, telling the provider nothing of the id."""
    return hashlib.sha256(conversation_id.encode()).hexdigest()[:32]


def tool_idempotency_key(conversation_id: str, reply_id: str | None, tool_call_id: str) -> str:
    """The idempotency key of tool call ``tool_call_id`` of reply ``reply_id`` (the assistant
    message holding the call) in conversation ``conversation_id`` (its key as stored, the
    tenant's prefix included when authentication is on): ``tw-k-`` and 32 hex digits of a SHA-256
    of the three, the same on every attempt, recovery and replica, for every tool home
    (``ToolExecution.idempotency_key``, ``ExecuteToolRequest.idempotency_key``, an MCP call's
    ``_meta``; docs/tools.md, "Idempotency keys"). The reply tells apart two calls of one id:
    call ids are unique within a reply only (docs/semantics.md §11, "Tool call identity"), and a
    conversation deleted and started again may see its ids again. ``reply_id`` None: the key of
    a turn an older sidecar stored (``TurnSpec.call_keys`` 1), of the conversation and the call
    id alone, so a recovery runs its started calls again with the key they were first given."""
    text = (
        f"{conversation_id}\0{tool_call_id}"
        if reply_id is None
        else f"{conversation_id}\0{reply_id}\0{tool_call_id}"
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{RESERVED_PREFIX}k-{digest[:32]}"
