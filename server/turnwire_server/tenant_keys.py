"""Which tenant a store key belongs to: ``"<tenant>/<id>"``, or a bare id for the default tenant
"" (the key scheme of api/tenancy.py, docs/operate/authentication.md). Here, apart from the API
layer, because the engine labels metrics by tenant and may not import the API."""

from __future__ import annotations

SEPARATOR = "/"
"""Between the tenant and the id in a store key."""


def tenant_of_key(key: str) -> str:
    """The tenant whose store key ``key`` is ("" for the default tenant's, which hold no
    :data:`SEPARATOR`)."""
    tenant, separator, _ = key.partition(SEPARATOR)
    return tenant if separator else ""
