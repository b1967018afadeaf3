"""The SQLite store's disk fills up, or refuses writes (issue 34; docs/operate/outages.md).

The database lives on a small ``tmpfs`` of its own (the tests run as root; without the right to
mount one, they skip and say so). A filler file takes the space that is left:

- a new turn is refused with ``RESOURCE_EXHAUSTED``, reason ``STORE_FULL``, a ``RetryInfo``
  delay and a message naming neither the file nor the mount; nothing of it is stored;
- a turn in flight when the disk fills completes once space returns (its final write waits);
- deleting the filler is all it takes: the same process serves again, and every message
  acknowledged before is still there, once.

A read-only file system: the sidecar refuses to start on one and says the store refuses writes.
Making it read-only under a live sidecar is not possible here: the kernel refuses to remount
read-only a file system with files open for writing (only a file system error forces that),
so that case is a skip that says so.

Before (main at 5106143): a full disk was ``UNAVAILABLE`` ``STORE_UNAVAILABLE`` quoting SQLite
(a batch of several writes lost even that cause: SQLite rolls the whole transaction back, and the
next savepoint's ``no such savepoint`` was reported instead); the read-only start passed already.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from support.sidecar import SidecarFactory, SidecarProcess

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2

MOUNT_MB = 8
WORDS = [f"w{i}" for i in range(15)]
CONFIG = {
    "providers": {
        "scripted": {
            "scripts": {
                "short": [{"text": "stored after the disk had room again"}],
                # 15 chunks 100 ms apart: the disk fills while the answer streams.
                "slow": [{"text": " ".join(WORDS), "delay_ms": 100}],
            }
        }
    },
    "checkpoint": {"interval_ms": 50},
    "durability": {"store_outage_seconds": 120},
}
# A question bigger than what a WAL file's reused pages and the file's free pages can absorb.
BIG = "x" * 600_000


@contextlib.contextmanager
def small_disk() -> Iterator[Path]:
    """A ``MOUNT_MB`` MiB ``tmpfs`` mounted on a new directory; skips when it cannot mount."""
    where = Path(tempfile.mkdtemp(prefix="turnwire-full-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={MOUNT_MB}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"a full disk needs a small tmpfs, and mounting one failed: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def fill(where: Path) -> Path:
    """Write a filler file into ``where`` until the disk is full; returns it."""
    filler = where / "filler"
    # Unbuffered: nothing is left to flush at close (a buffered file's close raised ENOSPC again).
    with filler.open("wb", buffering=0) as out:
        chunk = b"\0" * 65536
        try:
            while True:
                out.write(chunk)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    with contextlib.suppress(OSError), filler.open("ab", buffering=0) as out:  # the last partial block
        while True:
            out.write(b"\0")
    return filler


@pytest.fixture
async def sidecar_on_small_disk(
    sidecar_factory: SidecarFactory,
) -> AsyncIterator[tuple[SidecarProcess, Path]]:
    with small_disk() as where:
        sidecar = await sidecar_factory(CONFIG, store_url=f"sqlite:///{where}/turnwire.db").start()
        try:
            yield sidecar, where
        finally:
            sidecar.kill()


def assert_store_full(error: TurnwireError, where: Path) -> None:
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert error.reason == "STORE_FULL", error
    assert error.status is not None
    assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in error.status.details), error
    assert str(where) not in error.message and "turnwire.db" not in error.message, error.message


async def test_a_full_disk_refuses_new_turns_with_store_full_and_recovers_when_space_returns(
    sidecar_on_small_disk: tuple[SidecarProcess, Path],
) -> None:
    sidecar, where = sidecar_on_small_disk
    async with TurnwireClient(sidecar.target) as client:
        before = await collect(client.chat("before", "stored before the disk filled", model="scripted:short"))
        assert before.status_name == "COMPLETED"
        filler = fill(where)
        try:
            with pytest.raises(TurnwireError) as refused:
                await collect(client.chat("refused", BIG, model="scripted:short"))
            assert_store_full(refused.value, where)
        finally:
            filler.unlink()
        # The same process, no restart: space is back, so are writes.
        after = await collect(client.chat("refused", BIG, model="scripted:short"))
        assert after.status_name == "COMPLETED", after.error
        assert len((await client.get_conversation("before")).messages) == 2
        assert len((await client.get_conversation("refused")).messages) == 2  # the retry, once


async def test_a_turn_in_flight_when_the_disk_fills_completes_once_space_returns(
    sidecar_on_small_disk: tuple[SidecarProcess, Path],
) -> None:
    sidecar, where = sidecar_on_small_disk
    async with TurnwireClient(sidecar.target) as client:
        events = aiter(client.chat("in-flight", "tell me a story", model="scripted:slow"))
        seen = [await anext(events)]
        while seen[-1].WhichOneof("event") != "text_delta":
            seen.append(await anext(events))  # up to the first chunk: the turn is stored and running
        # Taking the space waits for nothing in the sidecar: the turn streams on meanwhile.
        filler = await asyncio.to_thread(fill, where)
        # A big write of our own fails now: the disk is full while the turn ends.
        with pytest.raises(TurnwireError) as refused:
            await collect(client.chat("other", BIG, model="scripted:short"))
        assert_store_full(refused.value, where)
        filler.unlink()
        seen.extend([event async for event in events])
        result = await collect(replay(seen))
        assert result.status_name == "COMPLETED", f"{result.error}\n{sidecar.log_text()[-3000:]}"
        assert result.text == " ".join(WORDS)
        history = await client.get_conversation("in-flight")
    assert result.message is not None
    assert [m.id for m in history.messages][1:] == [result.message.id]


async def replay(events: list[event_pb2.TurnEvent]) -> AsyncIterator[event_pb2.TurnEvent]:
    for event in events:
        yield event


async def test_a_read_only_store_is_refused_at_start_naming_the_cause(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    with small_disk() as where:
        first = await sidecar_factory(CONFIG, store_url=f"sqlite:///{where}/turnwire.db").start()
        assert await first.terminate() == 0
        await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,ro", str(where)], check=True)
        again = sidecar_factory(
            CONFIG, workdir=tmp_path / "again", store_url=f"sqlite:///{where}/turnwire.db"
        )
        with pytest.raises(Exception, match="exited") as failed:
            await again.start()
        assert "read-only" in str(failed.value), str(failed.value)[-2000:]


def test_a_store_made_read_only_under_a_live_sidecar() -> None:
    pytest.skip(
        "not testable here: the kernel refuses to remount read-only a file system with files open "
        "for writing (EBUSY); only a file system error forces it, which a test cannot cause"
    )
