"""``configure_logging``'s levels: the provider SDKs' HTTP client libraries stay quiet below
``warning`` (a fresh-user trial found a line per model request from loggers named httpx2)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from turnwire_server.logs import configure_logging, formatter_for


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    libraries = {name: logging.getLogger(name).level for name in ("httpx2", "httpcore2")}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, old in libraries.items():
        logging.getLogger(name).setLevel(old)


@pytest.mark.parametrize("level", ["debug", "info"])
def test_http_client_libraries_log_only_warnings(level: str, restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(level, stream=stream)
    logging.getLogger("httpx2").info('HTTP Request: POST http://upstream/v1/messages "HTTP/1.1 200 OK"')
    logging.getLogger("httpcore2.http11").debug("receive_response_body.started")
    logging.getLogger("httpx2").warning("a retry the library reports")
    logging.getLogger("turnwire.turn").info("ours")
    lines = stream.getvalue().splitlines()
    assert not any("HTTP Request" in line or "receive_response_body" in line for line in lines)
    assert any("a retry the library reports" in line for line in lines)
    assert any(line.endswith("ours") or " ours" in line for line in lines)


def test_an_error_level_holds_the_libraries_at_error_too(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("error", stream=stream)
    logging.getLogger("httpx2").warning("not shown at error")
    assert stream.getvalue() == ""


def test_a_context_id_the_message_spells_out_is_not_repeated() -> None:
    # A fresh-user trial: "chat request failed ... conversation_id='u1' ... conversation_id=u1".
    formatter = formatter_for("text")
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "failed conversation_id=%r", ("u1",), None)
    record.conversation_id, record.request_id = "u1", "r1"
    line = formatter.format(record)
    assert line.count("conversation_id=") == 1
    assert line.endswith("failed conversation_id='u1' request_id=r1")
