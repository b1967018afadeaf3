"""Who is calling: the principal and tenant the access interceptor authenticated.

:class:`~turnwire_server.api.access.AccessInterceptor` sets :data:`current_caller` around each
ChatService handler; the servicer reads it through :mod:`turnwire_server.api.tenancy`. With
``auth.enabled`` off every call is :data:`ANONYMOUS`: principal and tenant "", which leaves ids
unchanged.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: ``principal`` (a static token's name or a JWT's ``sub``) and the
    ``tenant`` whose conversations it may see ("" only when authentication is off)."""

    principal: str
    tenant: str


ANONYMOUS = Caller(principal="", tenant="")
"""The caller of every call when authentication is off."""

current_caller: contextvars.ContextVar[Caller] = contextvars.ContextVar("turnwire_caller", default=ANONYMOUS)
"""The caller of the call being handled (a context variable: it follows the handler's task)."""
