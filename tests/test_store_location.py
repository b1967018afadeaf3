"""Where the embedded SQLite store may be (``turnwire_server.store.sqlite_location``): in a directory
that exists. Fresh-user trial: ``serve --store sqlite:////nonexistent/dir/x.db`` created the
directories, migrated a new database and served an empty store, so a mistyped path silently gave a
new, empty store. The configuration now refuses such a URL, naming the directory and saying to
create it, and the store itself never creates a directory; the default store, ``turnwire.db`` in
the working directory, opens as before. Through the real command: ``tests/e2e/test_store_location_e2e.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from turnwire_server.assembly import open_configured_store
from turnwire_server.config import ConfigError, load_settings
from turnwire_server.store import StoreError
from turnwire_server.store.sqlite import SqliteStore


async def test_a_store_in_a_directory_that_does_not_exist_is_refused_and_nothing_is_created(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing" / "dir"
    store = SqliteStore(missing / "x.db")
    with pytest.raises(
        StoreError, match=re.escape(f"the directory {missing} does not exist: create it first")
    ):
        await store.open()
    assert not (tmp_path / "missing").exists()
    missing.mkdir(parents=True)  # created as told, the same store opens
    await store.open()
    await store.close()
    assert (missing / "x.db").is_file()


async def test_a_store_whose_directory_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("not a folder")
    with pytest.raises(
        StoreError, match=re.escape(f"{tmp_path / 'notes'}, where the SQLite store x.db would be, is not")
    ):
        await SqliteStore(tmp_path / "notes" / "x.db").open()


def test_the_configuration_refuses_an_sqlite_url_whose_directory_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as absolute:
        load_settings(store={"url": f"sqlite:///{tmp_path}/missing/x.db"})
    assert f"store.url: the directory {tmp_path / 'missing'} does not exist: create it first" in str(
        absolute.value
    )
    # A relative path is the working directory's; the message names the directory whole.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(f"the directory {tmp_path / 'data'} does not exist")):
        load_settings(store={"url": "sqlite:///data/x.db"})
    (tmp_path / "data").mkdir()
    assert load_settings(store={"url": "sqlite:///data/x.db"}).store.url == "sqlite:///data/x.db"
    assert not (tmp_path / "data" / "x.db").exists(), "validating creates nothing"


async def test_the_default_store_is_turnwire_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings()  # no --store, no store.url
    assert settings.store.url == "sqlite:///turnwire.db"
    store = await open_configured_store(settings.store, patience_seconds=0, replica_id="test")
    await store.close()
    assert (tmp_path / "turnwire.db").is_file()
