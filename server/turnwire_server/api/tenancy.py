"""Tenant isolation at the API boundary: client ids to tenant-scoped store keys and back.

Design (docs/operate/authentication.md): a conversation, request, submission or schedule id a
client sends is stored under the key ``"<tenant>/<id>"``. Client ids never hold ``/``
(``api/validation.py``) and tenant names never do (``access_settings.TENANT_PATTERN``), so a key
names exactly one tenant and one id, and two tenants may use the same id. The engine and the
store see only keys and know nothing of tenants, except that the two listings take a key
prefix (:meth:`Store.list_conversations`, :meth:`Store.list_submissions`). Another tenant's
conversation is simply a key this tenant cannot form, so every RPC on it answers exactly as
for an id that does not exist: there is no ownership check that could be forgotten.

The mapping is applied to whole messages, so it covers every RPC:

* on the way in (:meth:`Tenancy.scope_request`), the request's top-level fields named in
  :data:`SCOPED_FIELDS` get the prefix; the servicer validates the id after it
  (:func:`local_id`), scopes the ids it makes itself (:func:`scoped_key`: server-assigned
  request and submission ids, the ``turnwire-parent-request-id`` metadata) and passes
  :func:`listing_prefix` to the listings;
* on the way out (:meth:`Tenancy.unscope`), those fields lose the prefix wherever they occur in
  a response or event, and so does every ``google.rpc.Status`` (call statuses, ``TurnEnd.error``,
  ``Submission.error``): its message, ErrorInfo metadata and BadRequest descriptions.

The default tenant "" (authentication off) leaves every id unchanged, so data stored before
authentication was turned on keeps working while it stays off. Hooks, tools and logs see the
scoped keys (they are the server's side of the boundary).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from functools import cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from turnwire_server.api.caller import current_caller
from turnwire_server.tenant_keys import SEPARATOR

SCOPED_FIELDS = frozenset(
    {"conversation_id", "request_id", "submission_id", "new_conversation_id", "schedule_id"}
)
"""The id fields that are scoped by tenant, in requests, responses and events alike."""

_STATUS = status_pb2.Status.DESCRIPTOR.full_name


def prefix_of(tenant: str) -> str:
    """The key prefix of ``tenant`` ("" for the default tenant)."""
    return f"{tenant}{SEPARATOR}" if tenant else ""


def listing_prefix() -> str:
    """The key prefix of the current caller's tenant: what the listings filter on."""
    return prefix_of(current_caller.get().tenant)


def caller_principal() -> str:
    """The principal of the call being handled ("" when authentication is off): whose budgets its
    turns run under (docs/cost.md, "Budgets")."""
    return current_caller.get().principal


def scoped_key(client_id: str) -> str:
    """The store key of ``client_id`` for the current caller ("" stays "")."""
    return listing_prefix() + client_id if client_id else client_id


def local_id(key: str) -> str:
    """The client's id in the current caller's ``key`` (the key itself when it has no such prefix)."""
    return key.removeprefix(listing_prefix())


class Tenancy:
    """The key mapping for one tenant (not the default one: use it only when ``tenant`` is set)."""

    def __init__(self, tenant: str) -> None:
        if not tenant or SEPARATOR in tenant:
            raise ValueError(f"not a tenant name: {tenant!r}")
        self.prefix = prefix_of(tenant)
        # The prefix where an id starts: not inside a longer word (another tenant's name ending in
        # this one) and not after a "/".
        self._in_text = re.compile(r"(?<![A-Za-z0-9._:/-])" + re.escape(self.prefix))

    # --- in ----------------------------------------------------------------------------

    def scope_request(self, request: Message) -> None:
        """Prefix the request's non-empty top-level id fields (:data:`SCOPED_FIELDS`), in place."""
        for name in _scoped_fields(request.DESCRIPTOR):
            value = getattr(request, name)
            if value:
                setattr(request, name, self.prefix + value)

    # --- out ---------------------------------------------------------------------------

    def unscope(self, message: Message) -> None:
        """Strip the prefix from every id field and status in ``message``, in place."""
        for field, action in _plan(message.DESCRIPTOR):
            if action is _Action.ID:
                value = getattr(message, field.name)
                if value.startswith(self.prefix):
                    setattr(message, field.name, value[len(self.prefix) :])
            elif field.is_repeated:
                for item in getattr(message, field.name):
                    self._unscope_message(item, action)
            elif message.HasField(field.name):
                self._unscope_message(getattr(message, field.name), action)

    def _unscope_message(self, message: Message, action: _Action) -> None:
        if action is _Action.STATUS:
            assert isinstance(message, status_pb2.Status)
            self.unscope_status(message)
        else:
            self.unscope(message)

    def unscope_text(self, text: str) -> str:
        """``text`` without the prefix before the ids it quotes."""
        return self._in_text.sub("", text) if self.prefix in text else text

    def unscope_status(self, status: status_pb2.Status) -> None:
        """Strip the prefix from a status's message, ErrorInfo metadata and BadRequest, in place."""
        status.message = self.unscope_text(status.message)
        for detail in status.details:
            for kind, edit in _DETAIL_EDITS:
                if detail.Is(kind.DESCRIPTOR):
                    unpacked = kind()
                    detail.Unpack(unpacked)
                    edit(self, unpacked)
                    detail.Pack(unpacked)


def _edit_error_info(tenancy: Tenancy, info: error_details_pb2.ErrorInfo) -> None:
    for key, value in list(info.metadata.items()):
        info.metadata[key] = tenancy.unscope_text(value)


def _edit_bad_request(tenancy: Tenancy, bad: error_details_pb2.BadRequest) -> None:
    for violation in bad.field_violations:
        violation.description = tenancy.unscope_text(violation.description)


_DETAIL_EDITS: tuple[tuple[type[Message], Callable[[Tenancy, Message], None]], ...] = (
    (error_details_pb2.ErrorInfo, _edit_error_info),
    (error_details_pb2.BadRequest, _edit_bad_request),
)


class _Action(enum.Enum):
    """What :meth:`Tenancy.unscope` does with a field."""

    ID = "strip the prefix"
    STATUS = "unscope a google.rpc.Status"
    WALK = "walk the message"


@cache
def _scoped_fields(descriptor: Descriptor) -> tuple[str, ...]:
    return tuple(
        field.name
        for field in descriptor.fields
        if field.name in SCOPED_FIELDS and field.type == FieldDescriptor.TYPE_STRING
    )


@cache
def _plan(descriptor: Descriptor) -> tuple[tuple[FieldDescriptor, _Action], ...]:
    """The fields of ``descriptor`` that can hold a scoped id or a status, directly or below;
    cached per message type, so a message type without any (``Message``, ``Struct``) costs
    nothing to walk."""
    return _plan_of(descriptor, frozenset())


def _plan_of(descriptor: Descriptor, visiting: frozenset[str]) -> tuple[tuple[FieldDescriptor, _Action], ...]:
    plan: list[tuple[FieldDescriptor, _Action]] = []
    visiting = visiting | {descriptor.full_name}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING and field.name in SCOPED_FIELDS:
            plan.append((field, _Action.ID))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            child = field.message_type
            assert child is not None  # a message field has a message type
            if child.full_name == _STATUS:
                plan.append((field, _Action.STATUS))
            elif (
                child.full_name not in visiting
                and not child.GetOptions().map_entry
                and _plan_of(child, visiting)
            ):
                plan.append((field, _Action.WALK))
    return tuple(plan)
