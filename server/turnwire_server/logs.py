"""The sidecar's log output: one handler on stderr, text or JSON lines, context ids, secrets masked.

``logging.format: text`` (the default) writes ``TIME LEVEL LOGGER MESSAGE`` and, when known, the
context ids as ``key=value`` pairs after the message; ``json`` writes one JSON object per line
(python-json-logger) with ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, the
context ids (:mod:`turnwire_server.log_context`; left out when unknown), any structured fields a
call passed in ``extra`` (``event``, ``stage``, ``classification`` …) and ``exc_info`` for a
traceback.

Every line, in either format, passes a :class:`~turnwire_server.redaction.Redactor` (text: the
formatted line, traceback included; JSON: each string value before serialization): the secrets
the configuration holds or names, and anything shaped like a credential, are masked even if some
library logs them at DEBUG; the PostgreSQL store's address in the store's and psycopg's own lines
(:func:`configure_process_logging`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TextIO

from pythonjsonlogger.json import JsonFormatter

from turnwire_server.log_context import CONTEXT_FIELDS, REPLICA_FIELD, LogContextFilter
from turnwire_server.redaction import Redactor, redactor_for

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class _TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, then the context ids that are known (``request_id=…``); the whole text
    (traceback included) masked by ``redactor``."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__(TEXT_FORMAT)
        self.redactor = redactor

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        # An id the message already spells out (``conversation_id='u1'``) is not repeated.
        context = " ".join(
            f"{name}={value}"
            for name in CONTEXT_FIELDS
            if (value := getattr(record, name, "")) and f"{name}=" not in record.message
        )
        return f"{line} {context}" if context else line

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor.redact(super().format(record))


class _JsonFormatter(JsonFormatter):
    """One JSON object per record; context ids that are unknown are left out; every string value
    (message, traceback, structured fields) masked by ``redactor`` before it is serialized, so a
    line stays valid JSON whatever a secret looks like."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__(
            ["levelname", "name", "message"],
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp=True,
        )
        self.redactor = redactor

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        for name in (*CONTEXT_FIELDS, REPLICA_FIELD):
            if not log_data.get(name):
                log_data.pop(name, None)
        return {key: self._redacted(value) for key, value in log_data.items()}

    def _redacted(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redactor.redact(value)
        if isinstance(value, dict):
            return {key: self._redacted(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._redacted(item) for item in value]
        return value


def formatter_for(log_format: LogFormat, redactor: Redactor | None = None) -> logging.Formatter:
    """The formatter of ``log_format``, masking secrets with ``redactor`` (default: the
    credential patterns only)."""
    redactor = redactor or Redactor()
    return _JsonFormatter(redactor) if log_format == "json" else _TextFormatter(redactor)


STORE_LOGGERS: Final = ("psycopg", "turnwire_server.store")
"""The loggers whose lines may name the store's server (psycopg's pool: ``connection to server
at "db.internal" (10.0.0.7), port 5432 failed``; the PostgreSQL listener quoting it)."""


class _StoreAddressFilter(logging.Filter):
    """Masks the store's address (``mask``: ``PostgresTarget.redact_text``) in the message of a
    record from one of :data:`STORE_LOGGERS`: no store address in a log line
    (docs/operate/logs.md). Other loggers' lines are left alone (the sidecar's own listen
    address and its clients' are not the store's)."""

    def __init__(self, mask: Callable[[str], str]) -> None:
        super().__init__()
        self._mask = mask

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith(STORE_LOGGERS):
            record.msg, record.args = self._mask(record.getMessage()), None
        return True


SDK_REQUEST_LOGGERS: Final = ("anthropic", "openai")
"""The provider SDKs whose ``_base_client`` logs each request's options at DEBUG
(``Request options: {…}``), its body included: the system prompt, the whole history, tool inputs
and results."""

REQUEST_BODY_KEYS: Final = frozenset({"json_data", "content", "extra_json", "files"})
"""The keys of an SDK's request options that hold the request's body (conversation content)."""


class _RequestBodyFilter(logging.Filter):
    """Takes the body out of a provider SDK's ``Request options: {…}`` DEBUG record (a logger of
    :data:`SDK_REQUEST_LOGGERS`), keeping its method, URL, headers and retry settings: message
    content reaches no log line, at any level, as it reaches spans only with
    ``tracing.capture_message_content`` (docs/operate/logs.md)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.name.startswith(SDK_REQUEST_LOGGERS)
            and isinstance(record.msg, str)
            and record.msg.startswith("Request options")
            and isinstance(record.args, Mapping)
        ):
            kept = {key: value for key, value in record.args.items() if key not in REQUEST_BODY_KEYS}
            omitted = sorted(str(key) for key in record.args if key in REQUEST_BODY_KEYS)
            if omitted:
                kept["omitted"] = f"{', '.join(omitted)} (the request body: conversation content)"
            # A one-element tuple: a Mapping given as ``args`` would be read as named arguments.
            record.args = (kept,)
        return True


def configure_process_logging(settings: Any) -> logging.Handler:
    """:func:`configure_logging` as ``turnwire serve`` and its workers do, from ``settings`` (a
    ``Settings``): its level and format, every secret it holds or names masked
    (:func:`~turnwire_server.redaction.redactor_for`), and its PostgreSQL store's address in the
    store's and psycopg's lines (:func:`turnwire_server.store.address_mask`)."""
    from turnwire_server.store import address_mask  # the store package only where it is needed

    handler = configure_logging(settings.logging.level, settings.logging.format, redactor_for(settings))
    mask = address_mask(settings.store.url, settings.store.password_env)
    if mask is not None:
        handler.addFilter(_StoreAddressFilter(mask))
    return handler


def configure_logging(
    level: str,
    log_format: LogFormat = "text",
    redactor: Redactor | None = None,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every log record at ``level`` (``debug``, ``info`` …) and above to ``stream``
    (stderr) in ``log_format``, with the context ids and ``redactor`` (default: the credential
    patterns only) applied; replaces the root logger's handlers. Returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(LogContextFilter())
    handler.addFilter(_RequestBodyFilter())
    handler.setFormatter(formatter_for(log_format, redactor))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The provider SDKs' HTTP clients log every request at info and every socket event at debug,
    # under their own package names (httpx2, httpcore2): noise on the hot path, not ours to show.
    for name in QUIET_LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    return handler


def report_exit(settings: Any, message: str, *, level: int = logging.CRITICAL) -> None:
    """Say why the process ends before it served (``message``: ``cannot start: …``, or a stop
    signal during the start) where its log goes: under ``logging.format: json`` a log record of
    ``level`` from ``turnwire.server`` (one JSON object, as every other line, so a pipeline that
    parses JSON lines keeps it), else the line ``turnwire: <message>`` on stderr, as printed
    before logging is set up (docs/operate/logs.md)."""
    if settings.logging.format == "json":
        logging.getLogger("turnwire.server").log(level, "%s", message)
        return
    print(f"turnwire: {message}", file=sys.stderr, flush=True)


#: Loggers held at ``warning`` whatever ``logging.level`` says (docs/operate/logs.md).
QUIET_LIBRARY_LOGGERS = ("httpx2", "httpcore2", "httpx", "httpcore")


__all__ = [
    "QUIET_LIBRARY_LOGGERS",
    "TEXT_FORMAT",
    "LogFormat",
    "configure_logging",
    "formatter_for",
    "report_exit",
]
