"""How the shared core speaks SQL to either driver: statements, write programs and the dialect.

A store write is a **program**: a generator that yields batches of :class:`Statement`, is sent
back what each one read, decides with a pure function over those rows (raising a domain error
of :mod:`turnwire_server.store.errors` to write nothing), and returns its result. It holds no
connection: a driver runs it inside the write's transaction and commits. The SQLite driver runs
it on its writer thread, one statement after the other
(:func:`turnwire_server.store.sqlite.db.run_program`); the PostgreSQL driver sends each batch
in pipeline mode and waits once for the batch's reads, never for its writes
(:func:`turnwire_server.store.postgres.db.run_program`). So one program serves both.

Statements are written once, in the SQL both dialects accept, with ``?`` placeholders (the
PostgreSQL driver sends them as ``%s``: shared SQL holds no literal ``?`` or ``%``). What the
dialects spell differently (row locks, many rows in one statement) is a :class:`Dialect`'s.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeVar

__all__ = ["Dialect", "Program", "Statement", "folded", "in_marks", "joined", "just"]

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a program's batch.

    ``params`` are the statement's parameters, or with ``many`` a sequence of parameter rows
    (one execution each; none when empty). With ``fetch`` the program is sent the statement's
    rows (a list of tuples); with ``count``, how many rows it changed (PostgreSQL waits for it:
    meant for writes run outside pipeline mode); otherwise it is sent None and, on PostgreSQL,
    nothing waits for the statement before the commit.
    """

    sql: str
    params: Sequence[Any] | Mapping[str, Any] = ()
    fetch: bool = False
    many: bool = False
    count: bool = False


Program: TypeAlias = Generator[Sequence[Statement], list[Any], T]
"""A write's statements and decisions (see the module docstring): yields batches of statements,
is sent one entry per statement (its rows with ``fetch``, else None), returns the write's result."""


class Dialect(Protocol):
    """What a driver spells its own way in the statements the core writes."""

    name: str
    """``"sqlite"`` or ``"postgres"``: the store's name in messages (``"{name} store: …"``)."""

    lock_rows: str
    """Appended to a read of rows the write then changes: ``" FOR UPDATE"`` where several
    connections write at once (PostgreSQL), ``""`` where one writer applies writes in turn."""

    writes_with: bool
    """Whether one statement may carry other writes in its ``WITH`` clause (PostgreSQL's
    data-modifying CTEs), so :func:`folded` sends several writes as one statement."""

    claim_rows: str
    """Appended to a read of rows a maintenance write then changes: ``" FOR UPDATE SKIP LOCKED"``
    where several replicas sweep at once (each takes rows the others do not), ``""`` where one
    writer applies writes in turn."""

    conversation_tables: tuple[str, ...]
    """Statements (one ``?``: the conversation id) deleting a conversation's rows in tables only
    this driver has, run first when the conversation is deleted."""

    lease_renewals: tuple[str, ...]
    """Statements (two ``?``: the lease's end, the owner) renewing an owner's leases in tables
    only this driver has, run with the turns' and submissions' renewals."""

    def contains_bytes(self, column: str, needle: bytes) -> str:
        """A condition true when the blob ``column`` contains the bytes ``needle`` (a literal:
        no placeholder)."""
        ...

    def lock_conversation(self, conversation_id: str) -> Sequence[Statement]:
        """The statements that take ``conversation_id``'s write lock for the rest of the
        transaction (none where writes are applied one at a time)."""
        ...

    def insert_parts(self, conversation_id: str, rows: Sequence[Any]) -> Sequence[Statement]:
        """The statements that insert the parts of the new messages ``rows``
        (:class:`~turnwire_server.store.core.rows.MessageRow`), ``idx`` from 0 in each, at the
        conversation's history version (``turn_writes.CURRENT_VERSION``: only after the write's
        ``TOUCH_CONVERSATION``, migration 0014)."""
        ...

    def replace_parts(self, conversation_id: str, row: Any) -> Sequence[Statement]:
        """The statements that make the stored message ``row.id``'s parts exactly ``row.parts``,
        rewriting only changed ones (at the conversation's history version, as
        :meth:`insert_parts`)."""
        ...

    # What a line shared by several processes (PostgreSQL's cross-replica turn queue) does in
    # the transaction of a write; nothing where one process keeps the lines in memory.

    def lock_submissions(self) -> Sequence[Statement]:
        """The statements that serialize submission creations for the rest of the transaction
        (concurrent duplicates create one; ``seq`` follows acceptance)."""
        ...

    def submission_queued(self, submission: Any) -> Sequence[Statement]:
        """The statements that give the new ``submission``
        (:class:`~turnwire_server.store.records.SubmissionRecord`) its place in its
        conversation's shared line, and wake the processes that may claim it."""
        ...

    def submissions_ended(self, submission_ids: Sequence[str]) -> Sequence[Statement]:
        """The statements that free the places of submissions that ended without running."""
        ...

    def work_claimed(self, request_ids: Sequence[str], owner: str, until_us: int) -> Sequence[Statement]:
        """The statements that hand the places in line of claimed turns or submissions to
        ``owner`` with the lease ``until_us``, so recovered work keeps its place."""
        ...

    def events_stored(self, request_id: str) -> Sequence[Statement]:
        """The statements that wake the readers following turn ``request_id`` from other
        processes (delivered at commit)."""
        ...


def in_marks(count: int) -> str:
    """``?, ?, …`` for an ``IN (…)`` list of ``count`` values (both dialects; ``count`` >= 1)."""
    if count < 1:
        raise ValueError("an IN list needs at least one value")
    return ", ".join("?" * count)


def just(statements: Sequence[Statement]) -> Program[None]:
    """A program of one batch of ``statements`` that reads nothing."""
    yield statements


def folded(writes: Sequence[Statement], dialect: Dialect) -> list[Statement]:
    """``writes`` (statements that read nothing: no ``fetch``, ``many`` or ``count``), as one
    statement where the dialect allows it (:attr:`Dialect.writes_with`: all but the last in its
    ``WITH`` clause, which runs each to completion once, whatever the last one does), else as
    they are: a statement fewer to send, parse and plan each. All of them see one snapshot, so
    no two may change the same rows (the caller's to ensure)."""
    if not dialect.writes_with or len(writes) < 2:
        return list(writes)
    if any(write.fetch or write.many or write.count or isinstance(write.params, Mapping) for write in writes):
        raise ValueError("folded: writes only, with positional parameters")
    ctes = ", ".join(f"w{n} AS ({write.sql})" for n, write in enumerate(writes[:-1]))
    params = [value for write in writes for value in write.params]  # in the order of their marks
    return [Statement(f"WITH {ctes} {writes[-1].sql}", params)]


def joined(first: Program[T], second: Program[U]) -> Program[tuple[T, U]]:
    """``first`` and ``second`` as one program, batch by batch: each batch holds ``first``'s
    statements then ``second``'s (so their locks are taken in that order), and each is sent its
    own statements' results; one that ends early leaves the other's batches alone. Returns both
    results; an exception of either ends both (the transaction writes nothing)."""
    programs: list[Program[Any]] = [first, second]
    results: list[Any] = [None, None]
    batches: list[Sequence[Statement] | None] = [None, None]
    for n, program in enumerate(programs):
        try:
            batches[n] = next(program)
        except StopIteration as done:
            results[n] = done.value
    while any(batch is not None for batch in batches):
        found = yield [statement for batch in batches if batch is not None for statement in batch]
        at = 0
        for n, batch in enumerate(batches):
            if batch is None:
                continue
            part, at = found[at : at + len(batch)], at + len(batch)
            try:
                batches[n] = programs[n].send(part)
            except StopIteration as done:
                results[n], batches[n] = done.value, None
    return results[0], results[1]
