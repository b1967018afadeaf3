"""Persistence for conversations, messages and turns: the interface and its backends.

Importing this package loads no backend: :func:`open_store` imports the one a URL names.
"""

from __future__ import annotations

from collections.abc import Callable

from turnwire_server.store.base import ReachableStore, Store
from turnwire_server.store.errors import (
    ConversationNotFound,
    InvalidPageToken,
    MessageAlreadyAnswered,
    MessageBeingWritten,
    MessageIdConflict,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreInUse,
    StoreReadOnly,
    StoreUnreachable,
    TurnAlreadyExists,
    TurnNotFound,
    UnknownMessage,
)
from turnwire_server.store.postgres_url import is_postgres_url, parse_postgres_url, redact_url
from turnwire_server.store.records import (
    AddMode,
    AddResult,
    ConversationRecord,
    HeldTurn,
    TurnRecord,
    TurnState,
)
from turnwire_server.store.sqlite_location import SQLITE_PREFIX

__all__ = [
    "AddMode",
    "AddResult",
    "ConversationNotFound",
    "ConversationRecord",
    "HeldTurn",
    "InvalidPageToken",
    "MessageAlreadyAnswered",
    "MessageBeingWritten",
    "MessageIdConflict",
    "ReachableStore",
    "Store",
    "StoreCorrupted",
    "StoreError",
    "StoreFull",
    "StoreInUse",
    "StoreReadOnly",
    "StoreUnreachable",
    "TurnAlreadyExists",
    "TurnNotFound",
    "TurnRecord",
    "TurnState",
    "UnknownMessage",
    "address_mask",
    "open_store",
    "redact_url",
    "store_label",
]


def address_mask(url: str, password_env: str | None = None) -> Callable[[str], str] | None:
    """What masks the address of the store ``url`` names in any text (its host, port, user,
    database, IP addresses, password: :meth:`PostgresTarget.redact_text`), for the log
    redactor: the libraries' own log lines name it (psycopg's pool: ``connection to server at
    …``). None for the embedded SQLite store and for a URL the store would refuse."""
    if not is_postgres_url(url):
        return None
    try:
        return parse_postgres_url(url, password_env=password_env).redact_text
    except ValueError:
        return None


def store_label(url: str) -> str:
    """How log lines name the store ``url`` names: ``postgres`` for a PostgreSQL URL (no host,
    port, user or database: no store address in a log, docs/operate/logs.md), the
    ``sqlite:///path`` URL as is for the embedded store (a file of this host)."""
    return "postgres" if is_postgres_url(url) else url


def open_store(
    url: str, *, pool_size: int = 10, password_env: str | None = None, replica_id: str | None = None
) -> Store:
    """The store a database URL names, constructed but not opened (call ``await store.open()``).

    Understood: ``sqlite:///relative/path.db`` (relative to the working
    directory) and ``sqlite:////absolute/path.db``, SQLAlchemy style; the path
    is taken verbatim (no percent-decoding). ``postgresql://user[:password]@host[:port]/db``
    (or ``postgres://``) opens :class:`~turnwire_server.store.postgres.PostgresStore` with a
    pool of ``pool_size`` connections, the password from the URL, else from the environment
    variable ``password_env`` names, else ``PGPASSWORD``. Only the backend the URL names is
    imported. Raises :class:`ValueError` (naming the URL with any password masked) for any
    other scheme, a missing path, ``:memory:``, a query string or fragment on a SQLite URL,
    or a malformed PostgreSQL URL, or a ``replica_id`` (the PostgreSQL sessions' name, see
    :class:`~turnwire_server.store.postgres.PostgresStore`) too long for a session name.
    """
    if is_postgres_url(url):
        from turnwire_server.store.postgres import PostgresStore  # only the backend the URL names

        return PostgresStore(url, pool_size=pool_size, password_env=password_env, replica_id=replica_id)
    if not url.startswith(SQLITE_PREFIX):
        shown = redact_url(url)
        scheme = shown.partition("://")[0] if "://" in shown else shown
        raise ValueError(
            f"unsupported store URL {shown!r} (scheme {scheme!r}); use sqlite:///path or "
            "postgresql://user@host:port/database"
        )
    path = url.removeprefix(SQLITE_PREFIX)
    if not path or path == "/":
        raise ValueError(f"store URL {url!r} has no database path")
    if "?" in path or "#" in path:
        raise ValueError(f"store URL {url!r}: query strings and fragments are not supported")
    from turnwire_server.store.sqlite import SqliteStore  # only the backend the URL names

    return SqliteStore(path)
