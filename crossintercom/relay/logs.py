"""How the long-running commands log (docs/operations.md, "Logs"): a text line, or one JSON
object per line for a log pipeline (``--log-format json``, ``CROSSINTERCOM_LOG_FORMAT``).

Both carry the structured ``extra=`` fields a record has (a code, a host, a message id); in
both, any URL's password is masked (``storage.urls.mask_url``) wherever it appears, so a store
URL that reached a message or a field by mistake is not written out whole. Installed by the
CLI (and `python -m crossintercom.relay`), never by a library module.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

from crossintercom.local_broker.process.logcap import ExtraFormatter

TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"
# Anything shaped like a URL with a scheme: masked by mask_url, which keeps all but a password.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_STD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def mask_secrets(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    if "://" not in text:
        return text
    # Imported here: storage.urls brings psycopg and SQLAlchemy, which a command that logs no
    # URL (every harness turn's `wait`) should not pay for (docs/architecture.md, "Start-up").
    from crossintercom.storage.urls import mask_url

    return _URL.sub(lambda m: mask_url(m.group(0)), text)


class TextFormatter(ExtraFormatter):
    """The text line (``level logger: message key=value …``), secrets masked."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


def _jsonable(value: Any) -> Any:
    if isinstance(value, str):
        return mask_secrets(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return mask_secrets(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, event, the record's
    structured fields, and the traceback as ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": mask_secrets(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STD and key not in out:
                out[key] = _jsonable(value)
        if record.exc_info:
            out["exception"] = mask_secrets(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


def configure(level: int, log_format: str = "text") -> None:
    """Log to stderr at ``level`` in ``log_format`` ("text" or "json")."""
    logging.basicConfig(level=level)
    formatter: logging.Formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
