"""Logging: the asyncio logger's rate limit (a connection flood makes asyncio log every failed
accept()), and the priority journald reads off each line."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from specguard.common.logs import RateLimit, setup

ACCEPT = "socket.accept() out of system resource\nsocket: <socket fd=7>"


def record(msg: str, at: float) -> logging.LogRecord:
    made = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)
    made.created = at
    return made


def test_one_record_per_period_per_first_line_and_the_next_one_counts_the_dropped() -> None:
    limit = RateLimit(period=10.0)
    kept = [
        r
        for r in (record(ACCEPT.replace("7", str(n)), 100 + n * 0.01) for n in range(500))
        if limit.filter(r)
    ]
    assert len(kept) == 1  # the socket line differs; the message does not
    assert limit.filter(record("Task was destroyed but it is pending!", 101))  # another message passes
    later = record(ACCEPT, 110.5)
    assert limit.filter(later)
    assert later.getMessage().endswith("(499 more like it since the last one, not logged)")
    assert not limit.filter(record(ACCEPT, 111))


def test_the_limit_remembers_a_bounded_number_of_messages() -> None:
    limit = RateLimit(period=10.0)
    for n in range(5000):
        assert limit.filter(record(f"message {n}", 100 + n * 0.001))
    assert len(limit._last) <= 1001


@pytest.fixture
def root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.mark.usefixtures("root_logger")
def test_setup_puts_one_limit_on_the_asyncio_logger_however_often_it_runs() -> None:
    stream = io.StringIO()
    setup("json", stream=stream)
    setup("json", stream=stream)
    assert sum(isinstance(f, RateLimit) for f in logging.getLogger("asyncio").filters) == 1
    for _ in range(100):
        logging.getLogger("asyncio").error(ACCEPT)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 1 and lines[0]["msg"].startswith("socket.accept() out of system resource")


@pytest.mark.usefixtures("root_logger")
def test_on_the_journal_each_json_line_carries_its_syslog_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (tmp_path / "journal").open("w") as journal, (tmp_path / "elsewhere").open("w") as elsewhere:
        stat = os.fstat(journal.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{stat.st_dev}:{stat.st_ino}")
        setup("json", "info", journal)
        logging.getLogger("specguard").warning("reload failed")
        logging.getLogger("specguard").info("reloaded")
        setup("json", "info", elsewhere)  # output redirected away from the journal: no prefix
        logging.getLogger("specguard").warning("reload failed")
    journal_lines = (tmp_path / "journal").read_text().splitlines()
    assert [line[:3] for line in journal_lines] == ["<4>", "<6>"]
    assert json.loads(journal_lines[0][3:])["msg"] == "reload failed"
    (plain,) = (tmp_path / "elsewhere").read_text().splitlines()
    assert json.loads(plain)["level"] == "warning"
