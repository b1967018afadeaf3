"""What both stores' migration runners share: the packaged scripts, and which code versions may
run on a schema.

docs/architecture.md ("Schema migrations"): migrations are expand-then-contract, so replicas of
two adjacent versions can share a database during a rolling upgrade. A migration that only adds
(nullable columns, tables, indexes) says so in its first lines with
``-- turnwire: readable-by N``: code that knows schema ``N`` may run on a database with it
applied. Removing or renaming comes in a later migration, once no supported version reads the
old shape; such a migration declares nothing, so older code refuses the database.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Final

from turnwire_server.store.errors import StoreError

_READABLE_BY: Final = re.compile(r"^--\s*turnwire:\s*readable-by\s+(\d+)\s*$", re.MULTILINE)
_MIGRATION_FILE: Final = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def packaged_scripts(package: str) -> list[tuple[int, str, str]]:
    """The migrations packaged in ``package`` (files ``NNNN_name.sql``), in version order:
    ``(version, name, script)``, ``name`` the file stem.

    Raises :class:`StoreError` when a file name does not match ``NNNN_name.sql`` or the
    versions are not 1, 2, 3, ... without gaps (a packaging mistake).
    """
    found: list[tuple[int, str, str]] = []
    for entry in resources.files(package).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _MIGRATION_FILE.match(entry.name)
        if match is None:
            raise StoreError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        found.append(
            (int(match.group(1)), entry.name.removesuffix(".sql"), entry.read_text(encoding="utf-8"))
        )
    found.sort()
    if [version for version, _, _ in found] != list(range(1, len(found) + 1)):
        raise StoreError(f"migration versions are not 1..n: {[name for _, name, _ in found]}")
    return found


def readable_by(version: int, script: str) -> int:
    """The oldest schema version whose code may run on a database with migration ``version``
    (whose SQL is ``script``) applied: its ``readable-by`` line, else ``version`` itself."""
    match = _READABLE_BY.search(script)
    return min(int(match.group(1)), version) if match else version


def newer_schema_problem(known: int, newer: list[tuple[int, int | None]]) -> str | None:
    """Why code knowing schema ``known`` may not run on a database that also has the migrations
    ``newer`` (``(version, readable_by)`` of each one above ``known``); None when every one of
    them is readable by it."""
    blocking = [version for version, readable in newer if readable is None or readable > known]
    if not blocking:
        return None
    return (
        f"database schema version {max(v for v, _ in newer)} is newer than version {known}, the newest "
        f"this build of turnwire knows, and migration(s) {blocking} change what this build reads; "
        "upgrade turnwire"
    )
