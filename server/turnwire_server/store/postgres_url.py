"""PostgreSQL store URLs: recognising them, the password, and keeping it out of every message.

``postgresql://user:password@host:port/database`` (also ``postgres://``), libpq's URI form:
query parameters such as ``sslmode`` pass through to libpq. The password comes from the URL,
else from the environment variable ``store.password_env`` names, else libpq's own
``PGPASSWORD`` (or ``~/.pgpass``). It never appears in a log line or an error message:
:func:`redact_url` replaces it with ``***`` and :func:`redact_text` removes it from any text
(a driver error may quote what it was given).
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import SplitResult, unquote, urlsplit

__all__ = ["POSTGRES_SCHEMES", "PostgresTarget", "is_postgres_url", "parse_postgres_url", "redact_url"]

POSTGRES_SCHEMES: Final = ("postgresql", "postgres")
"""The URL schemes of the PostgreSQL store (libpq accepts both)."""

_MASK: Final = "***"
_ADDRESS_LIKE: Final = re.compile(r"(?<![\w.:])[0-9A-Fa-f.:]*[.:][0-9A-Fa-f.:]+(?![\w.:])")
"""A token that may be an IPv4 or IPv6 address in a driver's text (:func:`_mask_addresses` checks)."""
_AUTHORITY: Final = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/?#]*)")


def is_postgres_url(url: str) -> bool:
    """True when ``url`` starts with ``postgresql://`` or ``postgres://`` (any case)."""
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in POSTGRES_SCHEMES


def redact_url(url: str) -> str:
    """``url`` with the password of its user info (``user:password@``) replaced by ``***``.

    Any scheme; a URL without a password is returned unchanged. For log lines and error
    messages that name a store URL.
    """
    match = _AUTHORITY.match(url)
    if match is None:
        return url
    userinfo, at, hostinfo = match.group(2).rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not (at and colon):
        return url
    return f"{match.group(1)}{user}:{_MASK}@{hostinfo}{url[match.end() :]}"


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    """Where a PostgreSQL store connects: ``conninfo`` (the URL without its password, handed to
    libpq) and ``password`` (None: libpq looks for ``PGPASSWORD`` or ``~/.pgpass``).

    ``display`` is the URL with the password masked, for the operator's own command line (the
    CLI); log lines and errors name no address: :meth:`redact_text` removes the password and
    the address from any text.
    """

    conninfo: str
    display: str
    password: str | None = field(default=None, repr=False)

    def redact_text(self, text: str) -> str:
        """``text`` (a driver's error, say) with every occurrence of the password replaced by
        ``***``, the URL's host and port, as whole words, by ``<host>`` and ``<port>``, and any
        IP address by ``<address>``: a log line names no store address (a driver writes
        ``connection to server at "db.internal" (10.0.0.7), port 5432 failed``). The user and
        database names are kept: they say what to fix (``database "orders" does not exist``)."""
        secrets = [s for s in (self.password, os.environ.get("PGPASSWORD")) if s]
        for secret in secrets:
            text = text.replace(secret, _MASK)
        parts = urlsplit(self.conninfo)
        named = {"host": parts.hostname, "port": str(parts.port) if parts.port else None}
        for label, value in named.items():
            if value:
                text = re.sub(rf"(?<![\w.-]){re.escape(value)}(?![\w-])", f"<{label}>", text)
        return _mask_addresses(text)  # the address libpq resolved the host to


def _mask_addresses(text: str) -> str:
    """``text`` with each IPv4 or IPv6 address replaced by ``<address>`` (a time such as
    ``12:30:45`` is not one)."""

    def masked(match: re.Match[str]) -> str:
        try:
            ipaddress.ip_address(match.group(0))
        except ValueError:
            return match.group(0)
        return "<address>"

    return _ADDRESS_LIKE.sub(masked, text)


def parse_postgres_url(url: str, *, password_env: str | None = None) -> PostgresTarget:
    """Check ``url`` and split its password off.

    ``password_env`` names an environment variable holding the password, used when the URL
    has none. Raises :class:`ValueError` (its message never holds the password) for a URL that
    is not ``postgresql://`` or ``postgres://``, has no host and no database, has a
    fragment, or names a ``password_env`` variable that is not set.
    """
    display = redact_url(url)
    if not is_postgres_url(url):
        raise ValueError(f"not a PostgreSQL URL: {display!r}; use postgresql://user@host:port/database")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ValueError(f"store URL {display!r} is malformed: {redact_url(str(exc))}") from None
    if parts.fragment:
        raise ValueError(f"store URL {display!r}: fragments are not supported")
    if not parts.hostname and not parts.path.strip("/"):
        raise ValueError(f"store URL {display!r} names no host and no database")
    password = unquote(parts.password) if parts.password is not None else None
    if password is None and password_env:
        password = os.environ.get(password_env)
        if password is None:
            raise ValueError(
                f"store.password_env names the environment variable {password_env!r}, which is not set"
            )
    return PostgresTarget(conninfo=_without_password(parts), display=display, password=password)


def _without_password(parts: SplitResult) -> str:
    netloc = parts.netloc
    userinfo, at, hostinfo = netloc.rpartition("@")
    if at:
        user = userinfo.partition(":")[0]
        netloc = f"{user}@{hostinfo}" if user else hostinfo
    return parts._replace(netloc=netloc).geturl()
