"""``turnwire serve --workers N`` (issue 17, "All cores"; turnwire_server/supervisor.py).

Real processes on a fresh PostgreSQL database: two workers share one port and both serve turns
(the turns' owners are both workers' replica ids); one scrape of the supervisor's metrics
endpoint adds up both workers' counts; SIGTERM to the supervisor drains a running turn and exits
0; a worker killed with SIGKILL is restarted and its running turn recovered through its lapsed
lease; the workers of a supervisor killed with SIGKILL stop on their own; a worker that keeps
dying makes the supervisor give up (exit 1); a port in use, a worker that cannot start, and the
SQLite store with more than one worker stop the start with a message
that says what to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.connect_calls import ConnectChat
from support.hooks import pythonpath_env
from support.sidecar import SidecarError, SidecarFactory, SidecarProcess, free_port, run_turnwire
from support.stores import postgres_database
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server import supervisor
from turnwire_server.config import load_settings

LEASE_SECONDS = 1.5
WORDS = [f"w{i}" for i in range(40)]
REST = "and that is the end."
WORKERS_ENV = {"TURNWIRE_WORKERS": "2"}
START_SECONDS = 60.0  # a worker's start on a loaded 2-core machine (as support.sidecar allows)


def config(metrics_port: int | None = None) -> dict[str, object]:
    settings: dict[str, object] = {
        "providers": {
            "scripted": {
                "scripts": {
                    "short": [{"text": "one two three four", "delay_ms": 5}],
                    "slow": [{"text": " ".join(WORDS), "delay_ms": 50, "retry": {"text": REST}}],
                }
            }
        },
        "checkpoint": {"interval_ms": 20},
        "store": {"pool_size": 4},
        "durability": {"lease_seconds": LEASE_SECONDS},
    }
    if metrics_port is not None:
        settings["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"}
    return settings


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


def sql(url: str, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(row) for row in conn.execute(query, params).fetchall()]


def replicas_by_pid(sidecar: SidecarProcess) -> dict[int, str]:
    """Each worker process's replica id, from the workers' start-up lines."""
    found = re.findall(r"worker \d of 2 \(pid (\d+)\) serving as replica (\S+)", sidecar.log_text())
    return {int(pid): replica for pid, replica in found}


def gone(pid: int) -> bool:
    """The process ended (a zombie not yet reaped by its new parent counts as ended)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def is_dir(path: str) -> bool:
    return Path(path).is_dir()


async def start_workers(sidecar: SidecarProcess) -> SidecarProcess:
    """Start the supervisor and wait until both workers serve (health alone reaches one). Each
    worker logs its replica id before it tells the supervisor it serves, so both ids are in the
    log once the supervisor's "2 workers serving" is (a test that read one id only would wait
    for turns on a worker it does not know of, or pass on the one it does)."""
    await sidecar.start()
    await wait_until(
        lambda: "2 workers serving" in sidecar.log_text(), START_SECONDS, what="both workers to serve"
    )
    assert len(replicas_by_pid(sidecar)) == 2, "both workers' replica ids precede the supervisor's line"
    return sidecar


def scrape_total(port: int, name: str, **labels: str) -> float:
    """The sum of the ``name`` samples whose labels include ``labels``, from one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    wanted = set(labels.items())
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= set(sample.labels.items())
    )


async def test_two_workers_serve_one_port_metrics_add_up_and_sigterm_drains(
    sidecar_factory: SidecarFactory, pg_url: str
) -> None:
    metrics_port = free_port()
    sidecar = await start_workers(sidecar_factory(config(metrics_port), WORKERS_ENV, store_url=pg_url))
    workers = replicas_by_pid(sidecar)

    # A new client, so a new connection, each turn: the kernel spreads connections over the
    # workers by a hash, so turns go on until both have run some (a loaded machine may keep a
    # connection alive into the next client; 64 turns on one worker has 2**-63 odds).
    turns = 0
    owners: set[str] = set()
    while owners != set(workers.values()) and turns < 64:
        async with TurnwireClient(sidecar.target) as client:
            result = await collect(client.chat(f"c{turns}", "hi", model="scripted:short"))
            assert result.status_name == "COMPLETED"
        turns += 1
        owners = {str(row[0]) for row in sql(pg_url, "SELECT owner FROM turns")}
    assert owners == set(workers.values()), f"both workers ran turns (of {turns})"

    chats = scrape_total(metrics_port, "grpc_server_handled_total", grpc_method="Chat", grpc_code="OK")
    assert chats == turns, "one scrape adds up both workers' counts"
    assert scrape_total(metrics_port, "turnwire_open_streams") == 0

    metrics_dir = re.search(r"their files in (\S+)\)", sidecar.log_text())
    assert metrics_dir is not None and is_dir(metrics_dir[1])

    async with TurnwireClient(sidecar.target) as client:
        running = client.chat("draining", "tell me", model="scripted:slow")
        assert (await anext(running)).HasField("turn_start")
        sidecar.send_signal(signal.SIGTERM)  # the turn is running: the workers let it finish
        result = await collect(running)
    assert result.status_name == "COMPLETED", "the running turn finished within the grace"
    assert await sidecar.wait() == 0
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone, and reaped by the supervisor
    assert not is_dir(metrics_dir[1]), "the supervisor removed the multiprocess files"


async def test_two_workers_serve_the_http_port(sidecar_factory: SidecarFactory, pg_url: str) -> None:
    """``http.listen`` under ``--workers 2``: the supervisor holds the HTTP port too, both workers
    serve it (``SO_REUSEPORT``) and run the turns started over Connect."""
    settings = {**config(), "http": {"listen": f"127.0.0.1:{free_port()}"}}
    sidecar = await start_workers(sidecar_factory(settings, WORKERS_ENV, store_url=pg_url))
    workers = replicas_by_pid(sidecar)
    # A new connection each turn: the kernel picks a worker per connection by a hash of its
    # addresses, so turns go on until both workers ran some (64 on one has 2**-63 odds).
    door = ConnectChat(f"http://{settings['http']['listen']}", fresh_connection=True)  # type: ignore[index]
    turns = 0
    owners: set[str] = set()
    while owners != set(workers.values()) and turns < 64:
        request = chat_service_pb2.ChatRequest(
            conversation_id=f"h{turns}",
            model="scripted:short",
            message=message_pb2.Message(parts=[message_pb2.Part(text=message_pb2.TextPart(text="hi"))]),
        )
        events = [response.event async for response in door.stream("Chat", request)]
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
        turns += 1
        owners = {str(row[0]) for row in sql(pg_url, "SELECT owner FROM turns")}
    assert owners == set(workers.values()), f"both workers ran turns (of {turns})"
    sidecar.send_signal(signal.SIGTERM)
    assert await sidecar.wait() == 0


async def test_a_killed_worker_is_restarted_and_its_turn_recovered(
    sidecar_factory: SidecarFactory, pg_url: str
) -> None:
    sidecar = await start_workers(sidecar_factory(config(), WORKERS_ENV, store_url=pg_url))
    before = replicas_by_pid(sidecar)
    async with TurnwireClient(sidecar.target) as client:
        seen = 0
        try:
            async for event in client.chat(
                "crash", "a story", request_id="r-crash", model="scripted:slow", disconnect="continue"
            ):
                seen += event.HasField("text_delta")
                if seen == 5:
                    await wait_until(
                        lambda: sql(pg_url, "SELECT 1 FROM messages WHERE id = 'tw-a-r-crash'"),
                        what="a checkpoint of the partial reply",
                    )
                    [(owner,)] = sql(pg_url, "SELECT owner FROM turns WHERE request_id = 'r-crash'")
                    victim = next(pid for pid, replica in before.items() if replica == owner)
                    os.kill(victim, signal.SIGKILL)
        except Exception:  # the stream breaks with the worker
            pass

    def finished() -> bool:
        return sql(pg_url, "SELECT state, recovery_count FROM turns WHERE request_id = 'r-crash'") == [
            ("completed", 1)
        ]

    await wait_until(finished, timeout=LEASE_SECONDS * 20, what="a worker recovers the turn")
    log = sidecar.log_text()
    assert f"(pid {victim}) exited unexpectedly (killed by SIGKILL): restarting it" in log

    def restarted() -> bool:
        return len(replicas_by_pid(sidecar)) == 3

    await wait_until(restarted, START_SECONDS, what="the killed worker's replacement to serve")
    async with TurnwireClient(sidecar.target) as client:
        stored = await client.get_conversation("crash")
        assert [m.id for m in stored.messages][1:] == ["tw-a-r-crash"]

    # The supervisor itself dies: its workers see their stdin close and stop on their own.
    workers = list(replicas_by_pid(sidecar))
    sidecar.kill()
    try:
        for pid in workers:
            await wait_until(
                functools.partial(gone, pid), 90, what=f"worker pid {pid} to stop without its supervisor"
            )
    finally:
        for pid in workers:  # one that did not stop would outlive the test run (its own session)
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if "turnwire_server.worker" in process.cmdline():  # not a pid reused since
                    process.kill()


async def test_a_port_in_use_stops_the_supervisor_before_any_worker(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await run_turnwire(
            "serve",
            "--workers",
            "2",
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            "postgresql://nobody@127.0.0.1:5432/never_opened",
        )
    assert result.code == 1
    assert f"cannot start: cannot listen on 127.0.0.1:{port}: port {port} is in use" in result.stderr
    assert "worker 1 started" not in result.stderr


async def test_a_worker_that_cannot_start_stops_the_supervisor(pg_url: str, tmp_path: Path) -> None:
    broken = tmp_path / "turnwire.yaml"
    broken.write_text("middleware:\n  - path: no_such_module:Middleware\n")
    result = await run_turnwire(
        "serve", "--workers", "2", "--listen", "127.0.0.1:0", "--store", pg_url, "--config", str(broken)
    )
    assert result.code == 1
    assert "worker 1 cannot start: middleware[0] no_such_module:Middleware" in result.stderr
    assert "could not start (its message is above): stopping" in result.stderr


async def test_sqlite_with_more_than_one_worker_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "one.db"
    result = await run_turnwire("serve", "--workers", "2", "--store", f"sqlite:///{db}")
    assert result.code == 2
    assert "workers: 2 worker processes need the PostgreSQL store" in result.stderr
    assert "--workers 1" in result.stderr and f"turnwire migrate --from sqlite:///{db}" in result.stderr
    assert not db.exists(), "nothing was opened"


async def test_a_worker_that_keeps_dying_makes_the_supervisor_give_up(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The supervisor in this process, its bounds made small (the defaults: 0.5 s doubling, 5 exits).
    # Each worker exits 6 s after its configure_session: after it serves (which takes well under
    # that), so the first start succeeds and each later exit is a crash of a running worker.
    monkeypatch.setattr(supervisor, "FIRST_BACKOFF_SECONDS", 0.01)
    monkeypatch.setattr(supervisor, "MAX_QUICK_EXITS", 1)
    for name, value in pythonpath_env().items():
        monkeypatch.setenv(name, value)
    settings = load_settings(
        None,
        listen="127.0.0.1:0",
        workers=2,
        store={"url": pg_url},
        middleware=[{"path": "support.exits:ExitsSoon", "options": {"seconds": 6}}],
    )
    caplog.set_level(logging.INFO, logger="turnwire.supervisor")
    assert await supervisor.supervise(settings) == 1
    restarted = [r.getMessage() for r in caplog.records if "exited unexpectedly (exit status 3)" in r.message]
    assert restarted, "a worker was restarted once first"
    assert any(
        "exited 2 times in a row within 30 s of starting: giving up" in r.message for r in caplog.records
    )


async def test_signals_while_the_workers_start_stop_them_cleanly(
    sidecar_factory: SidecarFactory, pg_url: str
) -> None:
    """SIGHUP then SIGTERM right after the supervisor started its workers (still importing, no
    handler in place): no worker is killed by the SIGHUP and restarted, and the stop exits 0.

    Before: the SIGHUP killed each starting worker (restarted as "exited unexpectedly"), and a
    SIGTERM that met a starting worker made the supervisor exit 1 ("exited with -15")."""
    sidecar = sidecar_factory(config(), WORKERS_ENV, store_url=pg_url)
    starting = asyncio.ensure_future(sidecar.start())
    await wait_until(
        lambda: "worker 2 started" in sidecar.log_text() or starting.done(),
        START_SECONDS,
        what="the supervisor started its workers",
    )
    assert "workers serving" not in sidecar.log_text(), "the signals must meet starting workers"
    sidecar.send_signal(signal.SIGHUP)
    sidecar.send_signal(signal.SIGTERM)
    assert await sidecar.wait() == 0, sidecar.log_text()
    log_text = sidecar.log_text()
    assert "exited unexpectedly" not in log_text and "exited with" not in log_text, log_text
    assert "Traceback" not in log_text, log_text
    with contextlib.suppress(SidecarError):
        await starting  # it may have seen SERVING from a worker that started first
