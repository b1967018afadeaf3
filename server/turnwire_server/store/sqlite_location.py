"""Where the embedded SQLite store may be: in a directory that exists.

The store creates its file (and the ``-wal``, ``-shm`` and ``.lock`` files beside it) but never a
directory. A mistyped path (``--store sqlite:////nonexistent/dir/x.db``) used to create the
directories, migrate a new database and serve an empty store as if it were the one meant; it is
refused instead: at start-up by the configuration (``store.url``, exit 2), and by
:meth:`~turnwire_server.store.sqlite.SqliteStore.open` for any other opener. The default store,
``sqlite:///turnwire.db``, is in the working directory, which exists (docs/configuration.md).

Light on purpose: the configuration checks a URL with it without loading the SQLite backend.
"""

from __future__ import annotations

from pathlib import Path

SQLITE_PREFIX = "sqlite:///"
"""The scheme of an SQLite store URL; the rest is the path, taken verbatim (``open_store``)."""


def missing_directory(path: Path) -> str | None:
    """Why no SQLite store can be at ``path`` (a database file, relative to the working
    directory or absolute): the directory it would be in does not exist, or is not a directory;
    ``None`` when it is a directory. The message names that directory as an absolute path and
    says to create it."""
    folder = path.parent
    if folder.is_dir():
        return None
    shown = folder.absolute()
    if folder.exists():
        return f"{shown}, where the SQLite store {path.name} would be, is not a directory"
    return (
        f"the directory {shown} does not exist: create it first (mkdir -p {shown}). The SQLite "
        "store is created in an existing directory only, so that a mistyped path is not taken for "
        "a new, empty store"
    )


def url_missing_directory(url: str) -> str | None:
    """:func:`missing_directory` of the file an ``sqlite:///PATH`` URL names; ``None`` for any other
    URL (what else is wrong with a URL, ``open_store`` says)."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    return missing_directory(Path(url.removeprefix(SQLITE_PREFIX)))
