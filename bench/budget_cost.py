"""What budgets (issue 37, docs/cost.md "Budgets") add to a request's store writes, on SQLite and
PostgreSQL, against the 0.3 ms CPU allowance per request.

One request is a turn of ``--steps`` model steps, measured from its admission to its final write:
the writes a running turn makes in any case (a checkpoint of the reply at the end of each step but
the last, ``save_message``; the final write, ``finish_turn``) plus what budgets add, in three arms
run interleaved on the same stores:

- **off**: no budget configured (``step_budgets`` returns None: no estimate, no charge);
- **separate** (before the folds): each step's reservation its own transaction
  (``charge_budget``, settling the previous step), the step's checkpoint another, the last
  settlement another (``StepBudgets.close``), then the final write;
- **folded**: the first step's reservation its own transaction, each later step's reservation
  and the previous step's settlement riding that step's checkpoint (``charge_budget(...,
  checkpoint=...)``), the last settlement riding the final write (``finish_turn(..., budget=...)``);
- **admitted** (now): as folded, but the first step's reservation rides the turn's admission
  (``admit_turn(..., budget=...)``, sized by ``FirstStepEstimates`` as a process that served the
  conversation's last turn sizes it) and the step uses it without a write; the step estimates its
  prompt by message object as the engine does (``FirstStepEstimates.message_tokens``: only the
  two messages new since that turn's step; before 2026-12-03's stop 49 this arm walked all of
  them, as the others still do). PostgreSQL's one-flight admission carries it since stop 49
  (before, there this arm was the folded one plus the estimate).

- **read**: as admitted, with the engine's check that refuses a new turn on a spent budget a read
  of its own before the turn queues (``spent_budget``), as on a conversation busy in the
  process and, before 2026-12-04's stop 54, on every one.

Every arm is admitted by ``admit_turn`` (the engine's path), the turn's lock held to its end;
every arm but off runs that check: the admitted arm in the admission's transaction, on the rows
its first reservation takes (``admit_turn``'s ``refuse``, the engine's path on an idle
conversation since stop 54), the others by the read (before stop 51 the bench left it out).

The added cost of an arm is its CPU per request minus the off arm's: this process's
(``time.process_time``: the prompt estimate, the programs, the driver; the SQLite writer thread
included) and, on PostgreSQL, the server backends' (``/proc/<pid>/stat`` of the database's
sessions). Budgets: the turn's, the conversation's and the tenant's day, in tokens and US dollars
(three rows locked per charge), a model priced by ``pricing.models``, ``--messages`` messages of
400 bytes in each step's history (``--scopes tenant`` or another subset: only those budgets,
to show what each budget row adds). A request PASSes when budgets add at most 0.3 ms of CPU to it
(client plus server). Run: ``.venv/bin/python bench/budget_cost.py [--steps 1] [--rounds 15] [--block 20]``.

``--base DIR`` (another checkout, e.g. main's, from stop 54 on) adds a fifth arm, **base**: the
admitted arm with that checkout's charge program (its ``store/core/budget_writes.py`` and
``budget_rules.py``, loaded as modules of their own) and PostgreSQL one flight (its
``store/postgres/one_flight.py``, with its ``budget_flight.py`` from stop 62 on) in place of this
one's, the admission's charge and the final write's included; the admitted arm then runs this
checkout's programs loaded the same way (before stop 61 it ran the imported ones while the base arm
also ran the admission check as a read of its own: an A/A showed the base arm ~170 µs dearer),
interleaved with the others in the same process and stores (the arms' order reversed every other
round, so no arm always follows the same one), and a table of the rounds' paired differences
(admitted - base): an A/B that a loaded machine's drift between two runs would hide. The rest of the
request (the turn's writes, the estimate, the engine) is this checkout's.

``--stores sqlite`` (or ``postgres``) measures one store only (both are opened either way).

``--ledger`` adds a table of where each arm's CPU goes on SQLite, by thread: the event loop's (the
engine's budget code, the programs' hand-off), the writer's commits (the charge programs' Python,
their statements, the commit), the other threads' (the reader's: the admission check's read; the
writer thread's work outside its commits).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stores import analyzed, backend_cpu_s, both_stores

from turnwire.compaction import EstimateTokens
from turnwire.providers import ModelRequest
from turnwire.types import Cost, ModelSettings, Usage
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.budget_admission import (
    FirstStepEstimates,
    admission_charge,
    refusing_budgets,
    spent_budget,
)
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.budgets import StepBudgets
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.engine.request import TurnRequest
from turnwire_server.store import Store, TurnRecord
from turnwire_server.store.core import budget_writes, turn_writes
from turnwire_server.store.core import writes as core_writes
from turnwire_server.store.postgres import one_flight
from turnwire_server.store.records import BudgetGrant, BudgetLimits
from turnwire_server.store.sqlite.writer import SqliteWriter

REPO = Path(__file__).resolve().parents[1]

MODEL = "bench:model"
PRICES = PriceBook(PricingSettings.model_validate({"models": {MODEL: {"input_mtok": 3, "output_mtok": 15}}}))
SCOPES = {
    "turn": {"tokens": 10**12, "usd": 10**6},
    "conversation": {"tokens": 10**12, "usd": 10**6},
    "tenant": {"day": {"tokens": 10**12, "usd": 10**6}},
}
ALLOWANCE_US = 300.0
ARMS = ("off", "separate", "folded", "admitted", "read")
RATES = PRICES.rates(MODEL, None)
ESTIMATES = FirstStepEstimates()
_ESTIMATE = EstimateTokens()
_PROMPTS: dict[int, tuple[int, int]] = {}


_FLIGHT = one_flight.OneFlight._admit_flight  # PostgreSQL's one flight, as imported


def _use(charges: Any) -> None:
    """The store's writes, the admission's included (SQLite's start, PostgreSQL's one flight),
    call ``charges``' programs from now on (a module attribute of theirs), and the one flight
    is ``charges``' (a checkout's, :func:`_charges_of`) or this process's."""
    for module in (core_writes, turn_writes):
        setattr(module, "budget_writes", charges)  # noqa: B010 (not an exported name)
    one_flight.OneFlight._admit_flight = getattr(charges, "admit_flight", _FLIGHT)  # type: ignore[method-assign]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _charges_of(checkout: Path) -> Any:
    """``checkout``'s charge programs as the store's writes call them: its ``budget_rules`` and
    ``budget_writes`` executed while they stand in for the imported ones in ``sys.modules`` (so
    its writes import its rules), then put back; and its one flight (``store/postgres/
    one_flight.py``, with its ``budget_flight.py`` where it has one, both calling its programs).
    Both arms of an A/B load theirs this way, so neither runs on the modules the rest of the
    process warmed. Checkouts from stop 54 on (an ``admission_budget``)."""
    server = checkout / "server" / "turnwire_server" / "store"
    names = [f"turnwire_server.store.core.{name}" for name in ("budget_rules", "budget_writes")]
    saved = {name: sys.modules[name] for name in names}
    loaded: list[ModuleType] = []
    try:
        for name in names:
            loaded.append(_load(name, server / "core" / f"{name.rsplit('.', 1)[1]}.py"))
    finally:
        sys.modules.update(saved)
    writes = loaded[1]
    if not hasattr(writes, "admission_budget"):
        raise SystemExit(f"--base {checkout}: a checkout from stop 54 on (no admission_budget there)")
    tag = f"_bench_{abs(hash(checkout))}"
    flight = _load(f"turnwire_server.store.postgres.one_flight{tag}", server / "postgres" / "one_flight.py")
    if hasattr(flight, "budget_writes"):  # before the database decided the first reservation
        setattr(flight, "budget_writes", writes)  # noqa: B010 (not an exported name)
    if (decided := server / "postgres" / "budget_flight.py").exists():
        # Loaded with its checkout's writes standing in (before stop 64 it imported their
        # admitted_grant), then the imported ones put back.
        sys.modules[names[1]] = writes
        try:
            budget_flight = _load(f"turnwire_server.store.postgres.budget_flight{tag}", decided)
        finally:
            sys.modules.update(saved)
        setattr(flight, "budget_flight", budget_flight)  # noqa: B010
    return SimpleNamespace(
        charge_budget=writes.charge_budget,
        admission_budget=writes.admission_budget,
        admit_flight=flight.OneFlight._admit_flight,
    )


def _history(messages: int) -> list[message_pb2.Message]:
    history = []
    for n in range(messages):
        message = message_pb2.Message(
            id=f"m{n}", role=message_pb2.ROLE_USER if n % 2 == 0 else message_pb2.ROLE_ASSISTANT
        )
        message.parts.add().text.text = "word " * 80
        history.append(message)
    return history


def _taken(reply: message_pb2.Message) -> Callable[[], Awaitable[message_pb2.Message]]:
    """``Checkpointer.take`` of a turn whose reply is ``reply`` and no checkpoint in flight."""

    async def take() -> message_pb2.Message:
        return reply

    return take


async def _turn(
    store: Store,
    arm: str,
    steps: int,
    request: ModelRequest,
    n: int,
    *,
    budgets: BudgetSettings,
    read_check: bool,
) -> None:
    """One request of ``arm`` under ``budgets``: its admission (``admit_turn``, as the engine's;
    the admitted arm's carries the first reservation), its steps' writes and its
    final write, the lock held. Every arm but off checks the budgets before the turn: a read of its
    own when ``read_check``, else in the admission (``admit_turn``'s ``refuse``)."""
    turn = TurnRecord(
        request_id=f"{arm}-r{n}",
        conversation_id=f"{arm}-c{n}",
        assistant_message_id=f"{arm}-a{n}",
        continuation=False,
        model=MODEL,
        state="running",
        start_time=dt.datetime.now(dt.UTC),
        owner="bench",
    )
    user = message_pb2.Message(id=f"{arm}-u{n}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    first = None
    charged_at = dt.datetime.now(dt.UTC)
    # Every arm's: the engine has a turn's request whether or not budgets are on (before stop 69
    # only the admitted arm built it, ~5 µs of CPU counted as the budgets').
    asked = TurnRequest(
        conversation_id=turn.conversation_id,
        request_id=turn.request_id,
        messages=[user],
        body={},
        model=MODEL,
        continuation=False,
        response_type=object,
    )
    if arm == "admitted":
        first = admission_charge(budgets, ESTIMATES, asked, turn.lease, rates=RATES, now=charged_at)
    refuse: tuple[BudgetLimits, ...] = ()
    if arm != "off" and read_check:  # the engine's check on a busy conversation (a read, no lock)
        refused = await spent_budget(store, budgets, turn.conversation_id, "", turn.start_time)
        assert refused is None, refused
    elif first is not None:  # on an idle one it rides the admission: its charge's budgets, as the engine's
        refuse = tuple(limits for limits in first.budgets if limits.key.scope != "turn")
    elif arm != "off":
        refuse = refusing_budgets(budgets, turn.conversation_id, "", turn.start_time)
    async with store.admit_turn(
        turn, [user], lease_seconds=30, read_compaction=False, queued=_ignored, budget=first, refuse=refuse
    ) as admission:
        await _steps(
            store,
            arm,
            steps,
            request,
            turn,
            admitted=admission.budget,
            admitted_at=charged_at,
            limits=budgets,
        )


def _served(arm: str, n: int, request: ModelRequest) -> None:
    """Before request ``n`` of ``arm`` (not timed): as the process that served its conversation's
    last turn, whose step sent ``request``'s history but its last two messages (that turn's reply
    and this turn's input) and estimated it by message object (what that step paid to learn
    it is not this request's). The admitted arm's only: the others stand for mains before it."""
    if arm == "admitted":
        conversation_id = f"{arm}-c{n}"
        ESTIMATES.message_tokens(conversation_id, request.messages[:-2])
        ESTIMATES.sent(conversation_id, *_prompt_of(request))


def _prompt_of(request: ModelRequest) -> tuple[int, int]:
    """``request``'s estimated prompt and, of it, its system prompt and tools, in tokens (the
    bench's one request, estimated once)."""
    if id(request) not in _PROMPTS:
        framing = _ESTIMATE.framing(request)
        _PROMPTS[id(request)] = (_ESTIMATE.messages(request.messages) + framing, framing)
    return _PROMPTS[id(request)]


def _ignored(_: bool) -> None:
    """``admit_turn``'s ``queued``: nothing waits here."""


async def _steps(
    store: Store,
    arm: str,
    steps: int,
    request: ModelRequest,
    turn: TurnRecord,
    *,
    admitted: BudgetGrant | None,
    admitted_at: dt.datetime,
    limits: BudgetSettings,
) -> None:
    """The turn's steps' writes and its final write (see :func:`_turn`)."""
    reply = message_pb2.Message(id=turn.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
    budgets = None
    if arm != "off":
        budgets = StepBudgets(
            store,
            limits,
            PRICES,
            request_id=turn.request_id,
            conversation_id=turn.conversation_id,
            lease=turn.lease,
            turn_limit=limits.turn,
            recovered=False,
            admitted=admitted,
            admitted_at=admitted_at,
            estimates=ESTIMATES if arm == "admitted" else None,
        )
    for step in range(steps):
        if budgets is not None:
            await budgets.reserve(
                request,
                MODEL,
                None,
                None,
                checkpoint=_taken(reply) if arm != "separate" and step > 0 else None,
            )
            budgets.used(Usage(input_tokens=500, output_tokens=50), Cost(0.002, "config"))
        reply.parts.add().text.text = f"step {step} " * 40
        # The step's checkpoint, with no budget too (else: the next charge carries it).
        if step < steps - 1 and arm in ("off", "separate"):
            await store.save_message(turn.conversation_id, reply, lease=turn.lease)
    charge = None
    if budgets is not None and arm == "separate":
        await budgets.close()
    elif budgets is not None:
        charge = budgets.final_charge()
    ended = dataclasses.replace(turn, state="completed", end_time=dt.datetime.now(dt.UTC))
    grant = await store.finish_turn(ended, reply, budget=charge)
    if budgets is not None and charge is not None:
        budgets.settled_by(grant)


_WRITER_CPU = [0.0]  # the SQLite writer thread's CPU seconds in its commits, with --ledger


def _ledgered(commit: Callable[..., Any]) -> Callable[..., Any]:
    """``SqliteWriter._commit`` adding its thread's CPU to :data:`_WRITER_CPU` (``--ledger``)."""

    def timed(self: Any, applies: Any) -> Any:
        started = time.thread_time()
        try:
            return commit(self, applies)
        finally:
            _WRITER_CPU[0] += time.thread_time() - started

    return timed


async def _block(
    store: Store,
    arm: str,
    request: ModelRequest,
    *,
    turns: int,
    steps: int,
    url: str | None,
    base: int,
    budgets: BudgetSettings,
    read_check: bool = False,
    ledger: dict[str, list[float]] | None = None,
) -> tuple[list[float], list[float], float]:
    """``turns`` requests of ``arm`` (see :func:`_turn`): each one's client CPU and
    wall, and the server's CPU per request over the block, in µs; with ``ledger``, each one's
    CPU by thread added to it (``loop``: this thread's, ``writer``: the SQLite writer's commits,
    ``other``: the rest of the process's, the reader's thread among them)."""
    server_before = backend_cpu_s(url) if url else 0.0
    cpu, wall = [], []
    for n in range(turns):
        _served(arm, base + n, request)
        writer_before, loop_before = _WRITER_CPU[0], time.thread_time()
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        await _turn(store, arm, steps, request, base + n, budgets=budgets, read_check=read_check)
        cpu.append((time.process_time() - cpu_before) * 1e6)
        wall.append((time.perf_counter() - wall_before) * 1e6)
        if ledger is not None:
            loop, writer = (time.thread_time() - loop_before) * 1e6, (_WRITER_CPU[0] - writer_before) * 1e6
            ledger.setdefault("loop", []).append(loop)
            ledger.setdefault("writer", []).append(writer)
            ledger.setdefault("other", []).append(cpu[-1] - loop - writer)
    server = ((backend_cpu_s(url) - server_before) / turns * 1e6) if url else 0.0
    return cpu, wall, server


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=20, help="requests per arm in a row")
    parser.add_argument("--rounds", type=int, default=15, help="blocks of each arm, interleaved")
    parser.add_argument("--steps", type=int, default=1, help="model steps per request")
    parser.add_argument("--messages", type=int, default=20, help="messages in each step's history")
    parser.add_argument("--base", type=Path, help="another checkout: its charge program as a fifth arm")
    parser.add_argument(
        "--scopes",
        default="turn,conversation,tenant",
        help="the budgets configured, comma-separated (turn, conversation, tenant: its day)",
    )
    parser.add_argument(
        "--stores",
        default="sqlite,postgres",
        help="the stores measured, comma-separated (sqlite, postgres; both opened either way)",
    )
    parser.add_argument(
        "--ledger",
        action="store_true",
        help="also print where each arm's CPU goes on SQLite, by thread (loop, writer, other)",
    )
    args = parser.parse_args()
    if args.ledger:
        SqliteWriter._commit = _ledgered(SqliteWriter._commit)  # type: ignore[method-assign]
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    unknown = sorted(set(scopes) - SCOPES.keys())
    if unknown or not scopes:
        parser.error(f"--scopes: name one or more of {', '.join(SCOPES)} (got {args.scopes!r})")
    budgets = BudgetSettings.model_validate({s: SCOPES[s] for s in scopes})
    measured = {s.strip().lower() for s in args.stores.split(",") if s.strip()}
    if not measured or measured - {"sqlite", "postgres"}:
        parser.error(f"--stores: name sqlite, postgres or both (got {args.stores!r})")
    names = tuple(name for name in ("SQLite", "PostgreSQL") if name.lower() in measured)
    arms = (*ARMS, "base") if args.base else ARMS
    # arm -> the arm _turn runs, the charge program the store's writes call, its request ids'
    # offset, whether it checks the budgets by a read of its own
    runs: dict[str, tuple[str, Any, int, bool]] = {
        arm: (arm, budget_writes, 0, arm in ("separate", "folded")) for arm in ARMS
    }
    runs["read"] = ("admitted", budget_writes, 2 * 10**6, True)  # request ids apart from admitted's
    if args.base:  # request ids apart from admitted's; both arms' programs loaded alike
        runs["admitted"] = ("admitted", _charges_of(REPO), 0, False)
        runs["base"] = ("admitted", _charges_of(args.base.resolve()), 10**6, False)
    request = ModelRequest(
        model="model",
        system="You are a helpful assistant.",
        messages=_history(args.messages),
        settings=ModelSettings(),
    )
    # (store, arm) -> client CPU and wall samples per request, server CPU per request per block
    cpu: dict[tuple[str, str], list[float]] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    server: dict[tuple[str, str], list[float]] = {}
    blocks: dict[tuple[str, str], list[float]] = {}  # per round: client median + server, µs a request
    ledgers: dict[str, dict[str, list[float]]] = {arm: {} for arm in arms}  # SQLite's, by arm
    async with both_stores() as (lite, pg, url):
        stores = tuple(s for s in (("SQLite", lite, None), ("PostgreSQL", pg, url)) if s[0] in names)
        for _, store, store_url in stores:
            for arm in arms:  # warm: imports, caches, the statement cache
                run, charges, offset, read_check = runs[arm]
                _use(charges)
                await _block(
                    store,
                    run,
                    request,
                    turns=20,
                    steps=args.steps,
                    url=store_url,
                    base=offset - 100,
                    budgets=budgets,
                    read_check=read_check,
                )
        for r in range(args.rounds):
            if "PostgreSQL" in names:
                analyzed(url)  # as autovacuum keeps a growing server's statistics
            for name, store, store_url in stores:
                # Interleaved, each round in another order: a load change hits every arm alike,
                # and (every other round backwards) no arm always follows the same one.
                order = arms[r % len(arms) :] + arms[: r % len(arms)]
                for arm in order[::-1] if r % 2 else order:
                    run, charges, offset, read_check = runs[arm]
                    _use(charges)
                    samples, walls, per_request = await _block(
                        store,
                        run,
                        request,
                        turns=args.block,
                        steps=args.steps,
                        url=store_url,
                        base=offset + r * args.block,
                        budgets=budgets,
                        read_check=read_check,
                        ledger=ledgers[arm] if args.ledger and store is lite else None,
                    )
                    cpu.setdefault((name, arm), []).extend(samples)
                    wall.setdefault((name, arm), []).extend(walls)
                    server.setdefault((name, arm), []).append(per_request)
                    blocks.setdefault((name, arm), []).append(statistics.median(samples) + per_request)
        _use(budget_writes)
    load = os.getloadavg()[0]
    print(
        "| store | arm | client CPU µs/request | server CPU µs/request | wall µs/request "
        "| added CPU µs/request (client + server) | ≤ 300 µs |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        off_total = statistics.median(cpu[(name, "off")]) + statistics.median(server[(name, "off")])
        for arm in arms:
            client, server_cpu = statistics.median(cpu[(name, arm)]), statistics.median(server[(name, arm)])
            wall_us = statistics.median(wall[(name, arm)])
            row = f"| {name} | {arm} | {client:.0f} | {server_cpu:.0f} | {wall_us:.0f} "
            if arm == "off":
                print(row + "| – | – |")
                continue
            added = client + server_cpu - off_total
            print(row + f"| {added:.0f} | {'PASS' if added <= ALLOWANCE_US else 'MISS'} |")
    if args.ledger:
        _print_ledger(ledgers, arms)
    if args.base:
        _print_paired(blocks, names)
    print(
        f"\n{args.steps} model step(s) per request; medians of {args.rounds} interleaved blocks of "
        f"{args.block} requests per arm (client: of the requests; server: of the blocks); budgets: "
        f"{', '.join('tenant/day' if s == 'tenant' else s for s in scopes)} (tokens and USD); "
        f"{args.messages} messages of 400 bytes per step; "
        f"load average {load:.1f}"
    )


def _print_paired(blocks: dict[tuple[str, str], list[float]], names: tuple[str, ...]) -> None:
    """With ``--base``: this checkout's admitted arm against the base arm, round by round (the
    two ran within seconds of each other, so the machine's drift falls on both): the median of
    the rounds' differences, and their spread."""
    print("\n| store | admitted − base, µs/request (median of rounds' differences) | 25th–75th percentile |")
    print("|---|---|---|")
    for name in names:
        differences = [a - b for a, b in zip(blocks[(name, "admitted")], blocks[(name, "base")], strict=True)]
        low, _, high = statistics.quantiles(differences, n=4)
        print(f"| {name} | {statistics.median(differences):+.0f} | {low:+.0f} to {high:+.0f} |")


def _print_ledger(ledgers: dict[str, dict[str, list[float]]], arms: tuple[str, ...]) -> None:
    """The ``--ledger`` table: SQLite's CPU per request by thread, medians, and what each arm adds
    to the off arm's in each (the medians of parts need not add up to the whole's)."""
    print("\n| SQLite arm | event loop µs | writer µs | other threads µs | added: loop / writer / other |")
    print("|---|---|---|---|---|")
    off = {part: statistics.median(ledgers["off"][part]) for part in ("loop", "writer", "other")}
    for arm in arms:
        parts = {part: statistics.median(ledgers[arm][part]) for part in ("loop", "writer", "other")}
        added = " / ".join(f"{parts[p] - off[p]:+.0f}" for p in ("loop", "writer", "other"))
        row = f"| {arm} | {parts['loop']:.0f} | {parts['writer']:.0f} | {parts['other']:.0f} |"
        print(row + (" – |" if arm == "off" else f" {added} |"))


if __name__ == "__main__":
    asyncio.run(main())
