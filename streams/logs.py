"""Log formats of the ttft processes: ``text`` (for people) or ``json`` (one object per line, for a log
pipeline), chosen with ``ttft worker --log-format``. Both go to stderr."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final

LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601 UTC, milliseconds), ``level``, ``logger``, ``message``,
    ``pid``, ``thread``, ``exc`` (the formatted traceback) when there is one, and any ``extra`` fields."""

    _STANDARD: Final = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "thread": record.threadName,
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        for key, value in record.__dict__.items():
            if key not in self._STANDARD and not key.startswith("_"):
                entry[key] = value
        return json.dumps(entry, default=str, ensure_ascii=False)


def logging_config(level: str, log_format: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the root logger on stderr in ``log_format`` (also what the Faust
    worker of each role is given, so it does not install its own coloured handler)."""
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonLogFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    level = logging.getLevelName(getattr(logging, level.upper(), logging.WARNING))
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"ttft": formatter},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "ttft", "stream": "ext://sys.stderr"}},
        "root": {"level": level, "handlers": ["stderr"]},
    }


def configure_logging(level: str, log_format: str) -> None:
    """Root logging on stderr in ``log_format``, replacing handlers configured before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))
