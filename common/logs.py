"""Logging: JSON lines for journald and files, readable text on a terminal."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, TextIO

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


# syslog priorities (sd-daemon(3)): journald takes a "<N>" line prefix as the entry's priority
# (SyslogLevelPrefix=yes, its default), so `journalctl -p warning` finds specguard's warnings.
_PRIORITY = {"CRITICAL": 2, "ERROR": 3, "WARNING": 4, "INFO": 6, "DEBUG": 7}


class JournalJsonFormatter(JsonFormatter):
    """JSON lines with the priority prefix journald strips off."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_PRIORITY.get(record.levelname, 6)}>" + super().format(record)


def to_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is the journal's own stream: systemd sets ``$JOURNAL_STREAM`` to its
    device and inode (a program whose output is redirected elsewhere must not get prefixes)."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{stat.st_dev}:{stat.st_ino}"


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S")


def setup(log_format: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (default stderr) in the chosen format."""
    stream = stream or sys.stderr
    use_json = log_format == "json" or (log_format == "auto" and not stream.isatty())
    handler = logging.StreamHandler(stream)
    if use_json:
        handler.setFormatter(JournalJsonFormatter() if to_journal(stream) else JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # APScheduler logs every job run at INFO, and a skipped run at WARNING: specguard reports what
    # matters itself (once).
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, RateLimit) for f in asyncio_log.filters):
        asyncio_log.addFilter(RateLimit())


class RateLimit(logging.Filter):
    """At most one record a ``period`` per message text; the next one says how many were dropped.

    asyncio logs every failed accept() ("socket.accept() out of system resource") when the process
    runs out of file descriptors: thousands of lines a second during a connection flood.
    """

    def __init__(self, period: float = 10.0) -> None:
        super().__init__()
        self.period = period
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg).split("\n", 1)[0]  # asyncio appends the socket and exception below
        now = record.created
        last = self._last.get(key)
        if last is not None and now - last < self.period:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        if len(self._last) > 1000:  # bounded: forget the oldest messages
            for old in sorted(self._last, key=self._last.__getitem__)[:500]:
                self._last.pop(old, None)
                self._dropped.pop(old, None)
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.msg = f"{record.msg}\n({dropped} more like it since the last one, not logged)"
        return True
