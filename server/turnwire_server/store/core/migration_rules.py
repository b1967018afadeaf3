"""Rules both stores' migration runners share: which code versions may run on a schema.

docs/architecture.md ("Schema migrations"): migrations are expand-then-contract, so replicas of
two adjacent versions can share a database during a rolling upgrade. A migration that only adds
(nullable columns, tables, indexes) says so in its first lines with
``-- turnwire: readable-by N``: code that knows schema ``N`` may run on a database with it
applied. Removing or renaming comes in a later migration, once no supported version reads the
old shape; such a migration declares nothing, so older code refuses the database.
"""

from __future__ import annotations

import re
from typing import Final

_READABLE_BY: Final = re.compile(r"^--\s*turnwire:\s*readable-by\s+(\d+)\s*$", re.MULTILINE)


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
