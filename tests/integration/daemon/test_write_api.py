"""The daemon's write APIs (/api/silences, /api/ladder) over HTTP, given what a careless or hostile
client sends: ids no silence can have, silences that would last for ever, matchers that are not
strings, names with control characters, many DELETEs of one silence at once, and writes that are
not application/json. Each is answered 4xx with the reason, never 500, and nothing is stored."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.actions.vllm_restart import speculative
from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.dispatch import silences
from tests.ports import free_port
from tests.readings import Readings

TOKEN = "api-token-123"
RULES = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    condition: "< 0.5"
    actions: [log]
"""
DRAFT = {"method": "draft_model", "model": "tiny-draft", "num_speculative_tokens": 4}


def write_config(tmp_path: Path, **server: Any) -> Path:
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "speculative.env").write_text(speculative.render_env(DRAFT, "as deployed"))
    # a ladder whose vLLM is nowhere: no step is ever taken by these tests
    shrink = {"type": "vllm_restart", "ladder": [4, 2, 0], "url": f"http://127.0.0.1:{free_port()}",
              "env_file": {"path": "speculative.env"}, "command": ["true"]}  # fmt: skip
    config = {
        "server": {"port": 0, "webhook_token_file": "token", **server},
        "state_dir": "state",
        "interval": "100ms",
        "rules": ["rules.yaml"],
        "actions": {"shrink": shrink},
    }
    path = tmp_path / "specguard.yaml"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    path = write_config(tmp_path)
    loaded = load(path)
    assert loaded.ok, loaded.problems
    running = Daemon(loaded, path)
    running.source = Readings(0.8)
    await running.start(handle_signals=False)
    yield running
    await running.shutdown()


async def send(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    raw: str | None = None,
    content_type: str | None = "application/json",
    token: str | None = TOKEN,
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"http://127.0.0.1:{port}{path}", data=data, headers=headers) as answer,
    ):
        text = await answer.text()
        try:
            return answer.status, json.loads(text)
        except ValueError:
            return answer.status, text


async def stored(daemon: Daemon) -> list[silences.Silence]:
    return await daemon.store.call(lambda db: silences.listed(db, time.time(), everything=True))


def silence(**fields: Any) -> dict[str, Any]:
    return {"rule": "acceptance_low", "match": {"instance": "a"}, "for": "1h", "reason": "deploy", **fields}


async def test_ids_no_silence_can_have_get_404_with_the_reason(daemon: Daemon) -> None:
    status, made = await send(daemon.port, "POST", "/api/silences", silence())
    assert status == 201, made
    number = made["silence"]["id"]
    for text in ("99999999999999999999999", "9223372036854775808", "-1", f"-{number}", "0", "abc",
                 "1e3", f"{number}.0", f" {number}", "\u0661"):  # fmt: skip
        status, answer = await send(daemon.port, "DELETE", f"/api/silences/{text}")
        assert status == 404, (text, answer)
        assert answer["error"].startswith("no silence ") and "whole number" in answer["error"], answer
    status, answer = await send(daemon.port, "DELETE", "/api/silences/9223372036854775807")
    assert (status, answer["error"]) == (404, "no silence 9223372036854775807")
    assert [(s.id, s.expired) for s in await stored(daemon)] == [(number, None)]


async def test_a_silence_longer_than_the_longest_or_not_finite_is_refused(daemon: Daemon) -> None:
    for duration in ("31d", "99999999999w", "9" * 400 + "s", 86400.0 * 365):
        status, answer = await send(daemon.port, "POST", "/api/silences", silence(**{"for": duration}))
        assert status == 400, (duration, answer)
        assert answer["error"].startswith("for: "), answer
        assert "longer than the longest silence, 30d (server.max_silence)" in answer["error"] or (
            "finite" in answer["error"]
        ), answer
    status, answer = await send(daemon.port, "POST", "/api/silences", silence(**{"for": "31d"}))
    assert answer["error"] == "for: 31d is longer than the longest silence, 30d (server.max_silence)"
    for number in ("1e999", "NaN", "Infinity", "-Infinity", "-5"):
        text = json.dumps(silence()).replace('"1h"', number)
        status, answer = await send(daemon.port, "POST", "/api/silences", raw=text)
        assert status == 400 and answer["error"].startswith("for: "), (number, answer)
    assert await stored(daemon) == []
    status, answer = await send(daemon.port, "POST", "/api/silences", silence(**{"for": "30d"}))
    assert status == 201, answer


async def test_matchers_that_are_not_strings_and_control_characters_are_refused_naming_the_field(
    daemon: Daemon,
) -> None:
    for fields, named in (
        ({"match": {"instance": 5}}, "match.instance: a label value is a string, got 5"),
        ({"match": {"instance": None}}, "match.instance: a label value is a string, got null"),
        ({"match": {"instance": ["a"]}}, "match.instance: a label value is a string"),
        ({"match": {"instance": True}}, "match.instance: a label value is a string, got true"),
        ({"match": {"instance": {"=~": 5}}}, "match.instance.=~: a label value is a string, got 5"),
        ({"match": {"instance": {"~~": "a"}}}, "match.instance: unknown operator '~~'"),
        ({"match": {"instance": "a\x00b"}}, "match.instance: holds a control character (U+0000 at position 1)"),
        ({"match": {"instance": {"!=": "a\nb"}}}, "match.instance.!=: holds a control character (U+000A"),
        ({"match": {"inst\x00ance": "a"}}, "match: holds a control character (U+0000 at position 4)"),
        ({"match": {"instance\n": "a"}}, "match: holds a control character (U+000A"),
        ({"match": {"9lives": "a"}}, "match: '9lives' is not a label name"),
        ({"match": ["instance=a\x00"]}, "match: holds a control character (U+0000"),
        ({"rule": "acceptance_\x00low"}, "rule: holds a control character (U+0000 at position 11)"),
        ({"rule": "acceptance\u2028low"}, "rule: holds a control character (U+2028"),
        ({"reason": "deploy\x1b[2J"}, "reason: holds a control character (U+001B at position 6)"),
        ({"author": "ops\x85"}, "author: holds a control character (U+0085"),
        ({"author": "o" * 201}, "author: at most 200 characters"),
    ):  # fmt: skip
        status, answer = await send(daemon.port, "POST", "/api/silences", silence(**fields))
        assert status == 400, (fields, answer)
        assert answer["error"].startswith(named), (fields, answer)
    assert await stored(daemon) == []


async def test_of_concurrent_deletes_of_one_silence_one_expires_it_and_the_rest_get_404(
    daemon: Daemon,
) -> None:
    status, made = await send(daemon.port, "POST", "/api/silences", silence())
    assert status == 201, made
    number = made["silence"]["id"]
    answers = await asyncio.gather(
        *(send(daemon.port, "DELETE", f"/api/silences/{number}") for _ in range(20))
    )
    assert Counter(status for status, _ in answers) == {200: 1, 404: 19}, answers
    for status, answer in answers:
        if status == 404:
            assert answer["error"] == f"silence {number} had already ended", answer
            assert answer["silence"]["expired"] is not None
    (ended,) = await stored(daemon)
    assert ended.expired == next(a["silence"]["expired"] for s, a in answers if s == 200)


async def test_every_write_is_refused_415_unless_it_is_application_json(daemon: Daemon) -> None:
    status, made = await send(daemon.port, "POST", "/api/silences", silence())
    assert status == 201, made
    number = made["silence"]["id"]
    body = json.dumps(silence())
    # what a page elsewhere can make a browser send without asking first
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        for method, path, data in (
            ("POST", "/api/ladder/shrink", '{"to": 7, "who": "elsewhere"}'),
            ("DELETE", f"/api/silences/{number}", None),
            ("POST", "/api/silences", body),
        ):
            status, answer = await send(daemon.port, method, path, raw=data, content_type=kind)
            assert status == 415, (method, path, kind, answer)
            assert "Content-Type: application/json" in answer["error"], answer
    assert [(s.id, s.expired) for s in await stored(daemon)] == [(number, None)]
    # the token is asked for first, as before
    status, _ = await send(
        daemon.port, "POST", "/api/ladder/shrink", raw="{}", content_type="text/plain", token=None
    )
    assert status == 401
    # sent as JSON, the ladder's step is read (7 is no rung: nothing is done) and a name is checked
    status, answer = await send(daemon.port, "POST", "/api/ladder/shrink", {"to": 7, "who": "ops"})
    assert (status, answer) == (200, {"ok": False, "detail": "k=7 is not a rung of the ladder [4, 2, 0]"})
    status, answer = await send(daemon.port, "POST", "/api/ladder/shrink", {"to": "down", "who": "o\x00ps"})
    assert (status, answer) == (400, {"error": "who: holds a control character (U+0000 at position 1)"})
    status, answer = await send(
        daemon.port, "DELETE", f"/api/silences/{number}", content_type="application/json"
    )
    assert status == 200 and answer["silence"]["expired"] is not None


async def test_the_longest_silence_is_the_one_configured(tmp_path: Path) -> None:
    """A daemon with ``server.max_silence: 2h``: its API holds to that, not to the default."""
    path = write_config(tmp_path, max_silence="2h")
    loaded = load(path)
    assert loaded.ok, loaded.problems
    running = Daemon(loaded, path)
    running.source = Readings(0.8)
    await running.start(handle_signals=False)
    try:
        status, answer = await send(running.port, "POST", "/api/silences", silence(**{"for": "2h1s"}))
        assert (status, answer) == (
            400,
            {"error": "for: 2h1s is longer than the longest silence, 2h (server.max_silence)"},
        )
        status, answer = await send(running.port, "POST", "/api/silences", silence(**{"for": "2h"}))
        assert status == 201, answer
    finally:
        await running.shutdown()


def test_max_silence_is_checked_in_the_config(tmp_path: Path) -> None:
    for value, message in (
        ("0s", "the longest silence is from 1m to 365d (default 30d)"),
        ("59s", "the longest silence is from 1m to 365d (default 30d)"),
        ("366d", "the longest silence is from 1m to 365d (default 30d)"),
        ("forever", "invalid duration 'forever'"),
        (-1, "a duration cannot be negative"),
    ):
        loaded = load(write_config(tmp_path, max_silence=value))
        (problem,) = [p for p in loaded.problems if not p.warning]
        assert (problem.line, problem.field) == (1, "server.max_silence"), problem
        assert message in problem.message, problem
    loaded = load(write_config(tmp_path, max_silence="90d"))
    assert loaded.ok and loaded.config.server.max_silence == 90 * 86400.0, loaded.problems
    assert load(write_config(tmp_path)).config.server.max_silence == 30 * 86400.0
