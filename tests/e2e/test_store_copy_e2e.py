"""``turnwire migrate --from sqlite:///… --to postgresql://…``: a sidecar's SQLite store copied
into PostgreSQL and served from there, every message, submission and stored stream identical."""

from __future__ import annotations

from pathlib import Path

from support.sidecar import SidecarFactory, run_turnwire
from support.stores import postgres_database

from turnwire_client import TurnwireClient, collect

CONFIG = {"providers": {"scripted": {"scripts": {"short": [{"text": "one two three"}]}}}}


async def _snapshot(target: str) -> tuple[list[bytes], list[bytes], list[bytes]]:
    async with TurnwireClient(target) as client:
        conversations = [await client.get_conversation(c) for c in ("a", "b", "a-fork")]
        submission = await client.get_submission("s-1")
        events = [e async for e in client.resume_turn("r-a")]
    return (
        [c.SerializeToString(deterministic=True) for c in conversations],
        [submission.SerializeToString(deterministic=True)],
        [e.SerializeToString(deterministic=True) for e in events],
    )


async def test_an_sqlite_store_copied_to_postgres_serves_the_same_data(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    first = await sidecar_factory(CONFIG, workdir=tmp_path / "sqlite").start()
    async with TurnwireClient(first.target) as client:
        assert (await collect(client.chat("a", "What is 6 * 7?", request_id="r-a"))).ok
        assert (await collect(client.chat("b", "hello", model="scripted:short"))).ok
        await client.submit_messages("b", "and then?", submission_id="s-1", model="scripted:short")
        assert [e async for e in client.watch_submission("s-1")][-1].HasField("turn_end")
        # A fork (docs/forks.md): it reads a's rows, so its sharing is copied too.
        first_message = (await client.get_conversation("a")).messages[0].id
        await client.fork_conversation("a", first_message, new_conversation_id="a-fork")
    before = await _snapshot(first.target)
    assert await first.terminate() == 0, first.log_text()

    with postgres_database() as url:
        missing = tmp_path / "missing.db"
        status, out, err = await run_turnwire("migrate", "--from", f"sqlite:///{missing}", "--to", url)
        assert status == 1 and "no SQLite store at" in err and not missing.exists(), "a typo creates nothing"
        status, out, err = await run_turnwire("migrate", "--from", first.store_url, "--to", url)
        assert status == 0, err
        assert "copied 3 conversations" in out and "copied 1 submissions" in out
        status, out, err = await run_turnwire("migrate", "--from", first.store_url, "--to", url)
        assert status == 1 and "already holds conversations" in err, "never into a used store"

        second = await sidecar_factory(CONFIG, workdir=tmp_path / "postgres", store_url=url).start()
        assert await _snapshot(second.target) == before
        async with TurnwireClient(second.target) as client:
            assert (await collect(client.chat("a", "And 12 * 7?"))).ok, "it goes on from there"
        assert await second.terminate() == 0, second.log_text()
