"""Persistence for conversations, messages and turns: the interface and its backends.

Importing this package loads no backend: :func:`open_store` imports the one a URL names.
"""

from __future__ import annotations

from turnwire_server.store.base import (
    AddMode,
    AddResult,
    ConversationNotFound,
    ConversationRecord,
    InvalidPageToken,
    MessageAlreadyAnswered,
    MessageBeingWritten,
    MessageIdConflict,
    Store,
    StoreCorrupted,
    StoreError,
    StoreInUse,
    TurnAlreadyExists,
    TurnNotFound,
    TurnRecord,
    TurnState,
    UnknownMessage,
)

__all__ = [
    "AddMode",
    "AddResult",
    "ConversationNotFound",
    "ConversationRecord",
    "InvalidPageToken",
    "MessageAlreadyAnswered",
    "MessageBeingWritten",
    "MessageIdConflict",
    "Store",
    "StoreCorrupted",
    "StoreError",
    "StoreInUse",
    "TurnAlreadyExists",
    "TurnNotFound",
    "TurnRecord",
    "TurnState",
    "UnknownMessage",
    "open_store",
]

_SQLITE_PREFIX = "sqlite:///"


def open_store(url: str) -> Store:
    """The store a database URL names, constructed but not opened (call ``await store.open()``).

    Understood: ``sqlite:///relative/path.db`` (relative to the working
    directory) and ``sqlite:////absolute/path.db``, SQLAlchemy style; the path
    is taken verbatim (no percent-decoding). Raises :class:`ValueError` for any
    other scheme, a missing path, ``:memory:``, or a query string or fragment.
    """
    if not url.startswith(_SQLITE_PREFIX):
        scheme = url.partition("://")[0] if "://" in url else url
        raise ValueError(f"unsupported store URL {url!r} (scheme {scheme!r}); use sqlite:///path")
    path = url.removeprefix(_SQLITE_PREFIX)
    if not path or path == "/":
        raise ValueError(f"store URL {url!r} has no database path")
    if "?" in path or "#" in path:
        raise ValueError(f"store URL {url!r}: query strings and fragments are not supported")
    from turnwire_server.store.sqlite import SqliteStore  # only the backend the URL names

    return SqliteStore(path)
