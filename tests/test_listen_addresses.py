"""A listen address (``listen``, ``http.listen``, ``metrics.listen``) with a port out of range says
the range (fresh-user trial: ``serve --listen 127.0.0.1:99999`` answered only ``listen: must be
HOST:PORT``); port 0, any free port, stays allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from turnwire_server.cli import app
from turnwire_server.config import Settings

RANGE = "use a port of 1-65535, or 0 for any free port"


def _refusal(**config: Any) -> str:
    with pytest.raises(ValidationError) as refused:
        Settings(**config)
    (error,) = refused.value.errors()
    return ".".join(map(str, error["loc"])) + ": " + error["msg"].removeprefix("Value error, ")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"listen": "127.0.0.1:99999"},
            f"listen: port 99999 is out of range: {RANGE} (for example 127.0.0.1:50051)",
        ),
        (
            {"listen": "[::1]:65536"},
            f"listen: port 65536 is out of range: {RANGE} (for example 127.0.0.1:50051)",
        ),
        (
            {"listen": "127.0.0.1:http"},
            f"listen: port 'http' is not a number: {RANGE} (for example 127.0.0.1:50051)",
        ),
        (
            {"listen": "127.0.0.1:-1"},
            f"listen: port '-1' is not a number: {RANGE} (for example 127.0.0.1:50051)",
        ),
        ({"listen": "127.0.0.1"}, "listen: must be HOST:PORT, for example 127.0.0.1:50051"),
        ({"listen": ":50051"}, "listen: must be HOST:PORT, for example 127.0.0.1:50051"),
        (
            {"http": {"listen": "127.0.0.1:80800"}},
            f"http.listen: port 80800 is out of range: {RANGE} (for example 127.0.0.1:8080)",
        ),
        (
            {"metrics": {"listen": "0.0.0.0:94640"}},
            f"metrics.listen: port 94640 is out of range: {RANGE} (for example 127.0.0.1:9464)",
        ),
    ],
)
def test_a_bad_listen_address_says_what_to_fix(config: dict[str, Any], expected: str) -> None:
    assert _refusal(**config) == expected


@pytest.mark.parametrize("port", [0, 1, 65535])
def test_ports_in_range_and_zero_are_taken(port: int) -> None:
    address = f"127.0.0.1:{port}"
    settings = Settings(listen=address, http={"listen": address}, metrics={"listen": address})
    assert (settings.listen, settings.http.listen, settings.metrics.listen) == (address, address, address)


def test_serve_names_the_range_of_its_listen_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["serve", "--listen", "127.0.0.1:99999"], env={"TURNWIRE_LISTEN": None})
    assert result.exit_code != 0
    assert f"listen: port 99999 is out of range: {RANGE}" in result.output
    assert list(tmp_path.iterdir()) == []  # refused before the store was created
