"""Silences: added with the CLI or the HTTP API while the daemon runs, they hold back the actions
of the firings they match (recorded with their reason), and end by themselves or when expired."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.dispatch.silences import parse_match
from tests.processes import specguard
from tests.readings import Readings

TOKEN = "api-token-123"
CONFIG = """\
server: {port: 0, webhook_token_file: token}
state_dir: state
interval: 100ms
rules: [rules.yaml]
"""
RULES = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    condition: "< 0.5"
    actions: [log]
"""


@pytest.fixture
async def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Daemon]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specguard.yaml").write_text(CONFIG)
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "token").write_text(TOKEN)
    loaded = load(tmp_path / "specguard.yaml")
    assert loaded.ok, loaded.problems
    running = Daemon(loaded, tmp_path / "specguard.yaml")
    running.source = Readings()
    running.source.values = {"a": 0.8, "b": 0.8}
    await running.start(handle_signals=False)
    yield running
    await running.shutdown()


def runs(daemon: Daemon) -> list[tuple[str, str, str, str]]:
    db = sqlite3.connect(daemon.store.path)
    return list(
        db.execute(
            "SELECT e.labels, e.kind, r.status, r.reason FROM action_runs r JOIN events e "
            "ON e.id = r.event_id ORDER BY r.id"
        )
    )


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out: {what}")


async def cli(*args: str) -> tuple[int, str, str]:
    """``specguard silence ARGS`` in its own process, on the running daemon's state database."""
    return await specguard("silence", *args, "--config", "specguard.yaml", cwd=Path.cwd())


async def test_a_silence_from_the_cli_holds_back_the_firings_it_matches(daemon: Daemon) -> None:
    code, out, err = await cli("add", "--rule", "acceptance_*", "--match", "instance=a", "--for", "2h",
                         "--reason", "deploying a new draft", "--author", "oncall")  # fmt: skip
    assert code == 0, err
    assert out.startswith("silence 1: rule acceptance_* where instance=a, until ")
    source = daemon.source
    assert isinstance(source, Readings)
    source.values = {"a": 0.2, "b": 0.2}
    await until(  # both recorded, and neither still waiting or under way (started, not finished)
        lambda: len(runs(daemon)) == 2 and not {r[2] for r in runs(daemon)} & {"pending", "running"},
        "both ran",
    )
    by_series = {labels: (status, reason) for labels, _, status, reason in runs(daemon)}
    assert by_series['{"instance": "b"}'] == ("ok", "")
    status, reason = by_series['{"instance": "a"}']
    assert status == "deferred"  # not dropped: it runs when the silence ends, if a still fires
    assert reason.startswith("silenced: by silence 1 until ") and reason.endswith(
        "(oncall: deploying a new draft)"
    )

    code, out, _ = await cli("list")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["ID", "RULE", "MATCH", "ENDS", "(UTC)", "STATE", "AUTHOR", "REASON"]
    assert row.split()[:3] == ["1", "acceptance_*", "instance=a"] and "active" in row
    code, out, _ = await cli("list", "--format", "json")
    (listed,) = json.loads(out)
    assert (listed["id"], listed["match"], listed["expired"]) == (1, {"instance": "a"}, None)

    # expired while a still fires: its firing, held back, is acted on now (once)
    code, out, _ = await cli("expire", "1")
    assert code == 0 and out.startswith("silence 1 ended: rule acceptance_*")
    code, out, err = await cli("expire", "1")  # again: it had ended, as the API and the page say
    assert (code, out, err.strip()) == (1, "", "specguard silence expire: silence 1 had already ended")
    assert (await cli("list"))[1].splitlines()[1:] == []
    assert "expired" in (await cli("list", "--all"))[1]
    await until(lambda: [r[2] for r in runs(daemon)] == ["ok", "ok"], "a's firing acted on")

    # a firing silenced from start to end is never acted on: its resolution tells nobody
    code, _, err = await cli("add", "--rule", "acceptance_low", "--match", "instance=a", "--for", "2h",
                             "--reason", "draft swap", "--author", "oncall")  # fmt: skip
    assert code == 0, err
    source.values = {"a": 0.8, "b": 0.8}
    await until(lambda: sum(kind == "resolved" for _, kind, _, _ in runs(daemon)) == 2, "resolved")
    source.values = {"a": 0.2, "b": 0.8}
    await until(lambda: len(runs(daemon)) == 5, "a fired again")
    assert runs(daemon)[-1][:3] == ('{"instance": "a"}', "firing", "deferred")
    source.values = {"a": 0.8, "b": 0.8}
    await until(lambda: len(runs(daemon)) == 6, "a resolved again")
    rows = runs(daemon)
    assert rows[4][:3] == ('{"instance": "a"}', "firing", "skipped")
    assert rows[4][3].startswith("the series resolved while held back (silenced: by silence 2 until ")
    assert rows[5] == (
        '{"instance": "a"}',
        "resolved",
        "skipped",
        "the firing was not acted on: nothing to tell",
    )
    assert all(status == "ok" for _, _, status, _ in rows[:4])


async def test_the_cli_refuses_bad_silences_with_the_reason(daemon: Daemon) -> None:
    cases = [
        (["--match", "instance"], "'instance': give label=value"),
        (["--match", "model=~(["], "model"),
        (["--for", "soon"], "invalid duration 'soon'"),
        (["--for", "0s"], "must end after it starts"),
        (["--reason", " "], "reason: say why"),
    ]
    for extra, message in cases:
        args = {"--rule": "acceptance_low", "--for": "1h", "--reason": "x"}
        args.update(dict(zip(extra[::2], extra[1::2], strict=True)))
        flat = [item for pair in args.items() for item in pair]
        code, _, err = await cli("add", *flat)
        assert code == 2, (extra, err)
        assert err.startswith("specguard silence add: ") and message in err, (extra, err)
    code, _, err = await cli("expire", "99")
    assert code == 1 and "no silence 99" in err


def test_parse_match_reads_every_operator() -> None:
    assert parse_match(["a=1", "b!=2", "c=~x.*", "d!~y"]) == {
        "a": "1",
        "b": {"!=": "2"},
        "c": {"=~": "x.*"},
        "d": {"!~": "y"},
    }
    with pytest.raises(ValueError, match="matched twice"):
        parse_match(["a=1", "a=2"])


async def api(
    daemon: Daemon, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if method != "GET":
        headers["Content-Type"] = "application/json"  # every write says it, a body or not
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"http://127.0.0.1:{daemon.port}{path}", json=body, headers=headers
        ) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


async def test_the_http_api_adds_lists_and_expires_silences_with_the_token(daemon: Daemon) -> None:
    body = {
        "rule": "acceptance_low",
        "match": ["instance=b"],
        "for": "30m",
        "reason": "canary",
        "author": "ci",
    }
    assert (await api(daemon, "POST", "/api/silences", body, token=None))[0] == 401
    assert (await api(daemon, "POST", "/api/silences", body, token="wrong"))[0] == 401
    status, made = await api(daemon, "POST", "/api/silences", body)
    assert status == 201
    silence = made["silence"]
    assert (silence["rule"], silence["match"], silence["author"]) == (
        "acceptance_low",
        {"instance": "b"},
        "ci",
    )
    assert silence["ends"] - silence["starts"] == pytest.approx(1800)
    status, listed = await api(daemon, "GET", "/api/silences", token=None)  # reading needs no token
    assert status == 200 and [s["id"] for s in listed["silences"]] == [silence["id"]]

    bad = {
        "rule": "acceptance_low", "for": "30m", "reason": "x", "colour": "red",
    }  # fmt: skip
    status, answer = await api(daemon, "POST", "/api/silences", bad)
    assert status == 400 and "unknown field(s) colour" in answer["error"]
    status, answer = await api(daemon, "POST", "/api/silences", {"rule": "r", "reason": "x", "for": "never"})
    assert status == 400 and answer["error"].startswith("for: invalid duration 'never'")
    status, answer = await api(daemon, "POST", "/api/silences", {"rule": "r", "for": "1h"})
    assert status == 400 and "required" in answer["error"]

    assert (await api(daemon, "DELETE", f"/api/silences/{silence['id']}", token=None))[0] == 401
    status, ended = await api(daemon, "DELETE", f"/api/silences/{silence['id']}")
    assert status == 200 and ended["silence"]["expired"] is not None
    assert (await api(daemon, "DELETE", "/api/silences/999"))[0] == 404
    assert (await api(daemon, "GET", "/api/silences"))[1]["silences"] == []
