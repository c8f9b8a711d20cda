"""`specguard status` as an operator runs it, in its own process, against a daemon running in the
test's process (its rules moved by setting a number): what the daemon sees, its exit code for
healthy, degraded and unhealthy, and a clear message and its own exit code when nothing answers
or what answers is not specguard."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.config.loading import load
from specguard.daemon import overview
from specguard.daemon.runtime import Daemon
from specguard.dispatch import silences
from tests.hostile_deps import HostileDeps
from tests.processes import specguard
from tests.readings import Readings

CONFIG = """\
server: {port: 0, webhook_token_file: token}
state_dir: state
interval: 100ms
rules: [rules.yaml]
actions:
  fallback:
    type: feature_flag
    quiet_period: 1h
    file: {path: flags.json, engage: {speculative: false}, restore: {speculative: true}}
  shrink:
    type: vllm_restart
    ladder: [4, 2, 0]
    env_file: {path: speculative.env}
    unit: vllm.service
"""
RULES = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    condition: "< 0.5"
    window: 2m
    actions: [fallback, log]
  - name: acceptance_watch
    signal: acceptance_rate
    condition: "< 0.3"
    for: 1h
"""
ENV = """VLLM_SPECULATIVE_CONFIG='{"method": "draft_model", "model": "d", "num_speculative_tokens": 4}'\n"""


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out: {what}")


def start_in(tmp_path: Path, config: str = CONFIG) -> Daemon:
    (tmp_path / "specguard.yaml").write_text(config)
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "speculative.env").write_text(ENV)
    loaded = load(tmp_path / "specguard.yaml")
    assert not loaded.errors, loaded.problems
    return Daemon(loaded, tmp_path / "specguard.yaml")


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    running = start_in(tmp_path)
    running.source = Readings(0.8)
    await running.start(handle_signals=False)
    yield running
    await running.shutdown()


def url(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.port}"


async def test_status_shows_rules_fallbacks_silences_and_ladders_as_the_daemon_sees_them(
    daemon: Daemon,
) -> None:
    source = daemon.source
    assert isinstance(source, Readings)
    source.value = 0.2  # both rules breach: one fires (engaging the fallback), one waits for its `for`
    now = time.time()
    await daemon.store.call(
        lambda db: silences.add(db, "acceptance_watch", {}, now, now + 3600, "draft swap", "ops", now)
    )
    await until(
        lambda: daemon.status()["fallbacks"].get("fallback", {}).get("should_be") == "engaged", "engaged"
    )
    await until(lambda: (daemon.store.path.parent.parent / "flags.json").exists(), "the flag written")

    code, out, err = await specguard("status", "--url", url(daemon))
    assert code == 0, err
    lines = out.splitlines()
    assert (
        lines[0]
        == f"● specguard {daemon.status()['version']} at {url(daemon)}: healthy, 1 firing (acceptance_low)"
    )
    rules = lines.index("Rules (2, 1 firing, 1 pending)")
    firing, pending = lines[rules + 2].split(), lines[rules + 3].split()
    assert firing[:3] == ["acceptance_low", "instance=vllm-a:8000", "firing"]
    assert firing[-4:] == ["0.2", "0.5", "breach", "2m"]  # value, threshold, verdict, over what window
    assert pending[:3] == ["acceptance_watch", "instance=vllm-a:8000", "pending"]
    assert pending[-4:] == ["0.2", "0.3", "breach", "5m"]
    flags = lines.index("Fallbacks")
    assert lines[flags + 2].split()[:3] == ["fallback", "engaged", "since"]
    assert lines[flags + 3].strip() == 'held by acceptance_low{instance="vllm-a:8000"}'
    silence = lines[lines.index("Silences (1)") + 2].split()
    assert silence[:4] == ["1", "acceptance_watch", "-", "active"] and silence[-2:] == ["draft", "swap"]
    ladder = lines[lines.index("Ladders") + 2].split()
    assert ladder == ["shrink", "4", "[4]", "2", "0", "k=4", "-"]
    assert any(line.strip().startswith("Store: ") and line.endswith(": ok") for line in lines)

    code, out, err = await specguard("status", "--url", url(daemon), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["health"] == {"healthy": True, "status": "ok", "reason": None}
    assert doc["fallbacks"]["fallback"]["is"] == "engaged"
    assert [s["id"] for s in doc["silences"]] == [1]
    assert doc["ladders"][0]["k"] == 4
    assert doc["now"] >= now and doc["store"]["bytes"] > 0

    # acceptance back: the fallback stays engaged for its quiet period, and says until when
    source.value = 0.8
    await until(lambda: daemon.status()["fallbacks"]["fallback"]["should_be"] == "restored", "to be restored")
    code, out, err = await specguard("status", "--url", url(daemon))
    assert code == 0, err
    lines = out.splitlines()
    flags = lines.index("Fallbacks")
    flag = lines[flags + 2]
    assert flag.split()[:3] == ["fallback", "engaged", "since"]
    assert re.search(r" restored +\d\d:\d\d:\d\d \(in (59m\d+s|1h)\)$", flag), flag  # after the quiet hour
    assert lines[flags + 3].strip() == "nothing holds it"


async def test_status_finds_the_daemon_from_the_config(tmp_path: Path, unused_tcp_port: int) -> None:
    config = CONFIG.replace("port: 0", f"port: {unused_tcp_port}")
    running = start_in(tmp_path, config)
    running.source = Readings(0.8)
    await running.start(handle_signals=False)
    try:
        code, out, err = await specguard("status", "--config", str(tmp_path / "specguard.yaml"))
    finally:
        await running.shutdown()
    assert code == 0, err
    assert out.startswith(
        f"● specguard {running.status()['version']} at http://127.0.0.1:{unused_tcp_port}: healthy"
    )


async def test_a_target_down_is_degraded_exit_5(tmp_path: Path, unused_tcp_port: int) -> None:
    config = CONFIG + f"sources: {{scrape: {{targets: ['http://127.0.0.1:{unused_tcp_port}/metrics']}}}}\n"
    running = start_in(tmp_path, config)
    await running.start(handle_signals=False)
    try:
        await until(lambda: any(t["state"] == "down" for t in running.status()["sources"]["targets"]), "down")
        code, out, err = await specguard("status", "--url", url(running))
    finally:
        await running.shutdown()
    assert code == 5, err
    lines = out.splitlines()
    assert lines[0].endswith(": degraded, none firing")
    assert lines[1].startswith(f"  ! target 127.0.0.1:{unused_tcp_port} is down: ")
    assert "Targets (0/1 up)" in lines


async def test_a_daemon_whose_store_cannot_be_written_is_unhealthy_exit_1(daemon: Daemon) -> None:
    await daemon.store.refuse_writes(True)
    try:
        source = daemon.source
        assert isinstance(source, Readings)
        source.value = 0.2  # a change to write, which fails
        await until(lambda: daemon.store_error is not None, "the store fails")
        code, out, err = await specguard("status", "--url", url(daemon))
        json_code, json_out, _ = await specguard("status", "--url", url(daemon), "--json")
    finally:
        await daemon.store.refuse_writes(False)
    assert code == 1, err
    lines = out.splitlines()
    assert lines[0].endswith(": unhealthy, none firing")
    assert lines[1].startswith("  ! store_failing: ") and "readonly database" in lines[1]
    assert json_code == 1 and json.loads(json_out)["health"]["status"] == "store_failing"


async def test_nothing_listening_is_exit_3_with_what_to_do(unused_tcp_port: int) -> None:
    code, out, err = await specguard("status", "--url", f"http://127.0.0.1:{unused_tcp_port}")
    assert (code, out) == (3, "")
    (line,) = err.splitlines()
    assert line.startswith(
        f"specguard status: nothing answers at http://127.0.0.1:{unused_tcp_port} (connection refused): "
        "is the daemon running, and on this address?"
    )
    code, _, err = await specguard("status", "--url", f"http://127.0.0.1:{unused_tcp_port}", "--json")
    assert code == 3 and "nothing answers" in err


async def test_a_daemon_that_does_not_answer_in_time_is_exit_3() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes the request, never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code, out, err = await specguard("status", "--url", f"http://127.0.0.1:{port}", "--timeout", "0.5")
    finally:
        server.close()
    assert (code, out) == (3, "")
    assert (
        err
        == f"specguard status: http://127.0.0.1:{port} did not answer within 0.5s (a busy host: try --timeout)\n"
    )


def answering(status: int, body: bytes, content_type: str = "application/json") -> web.Application:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(status=status, body=body, content_type=content_type)

    app = web.Application()
    app.router.add_get("/api/status", handler)
    return app


@pytest.mark.parametrize(
    ("app", "said"),
    [
        (web.Application(), "answered HTTP 404 Not Found: is this specguard's address?"),
        (answering(200, b"<html>Grafana</html>", "text/html"), "did not answer with JSON"),
        (answering(200, b'{"status": "success", "data": []}'), "answered JSON without a specguard status's"),
        (
            answering(200, b'{"version": "1", "sources": {}, "rules": 7}'),
            "is not a specguard daemon's status",
        ),
    ],
    ids=["not-found", "not-json", "other-json", "malformed"],
)
async def test_a_server_that_is_not_specguard_is_exit_4(
    aiohttp_server: AiohttpServer, app: web.Application, said: str
) -> None:
    server = await aiohttp_server(app, host="127.0.0.1")
    code, out, err = await specguard("status", "--url", f"http://127.0.0.1:{server.port}")
    assert (code, out) == (4, "")
    (line,) = err.splitlines()
    assert line.startswith("specguard status: ") and said in line, line


async def test_a_server_that_does_not_speak_http_is_exit_4() -> None:
    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code, _, err = await specguard("status", "--url", f"http://127.0.0.1:{port}")
    finally:
        server.close()
    assert code == 4
    assert f"specguard status: http://127.0.0.1:{port} does not answer as an HTTP server does" in err


@pytest.mark.parametrize(
    ("args", "files", "said"),
    [
        (("--url", "127.0.0.1:9464"), {}, "--url '127.0.0.1:9464': give the daemon's address"),
        (("--timeout", "0"), {}, "--timeout must be positive"),
        (("--config", "specguard.yaml"), {"specguard.yaml": "server:\n  port: 99999\n"},
         "specguard.yaml:2: server.port: Input should be less than or equal to 65535"),
        (("--config", "missing.yaml"), {}, "missing.yaml: cannot read file"),
    ],
    ids=["url", "timeout", "port", "missing"],
)  # fmt: skip
async def test_a_mistake_on_the_command_line_is_exit_2_naming_it(
    tmp_path: Path, args: tuple[str, ...], files: dict[str, str], said: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    code, out, err = await specguard("status", *args, cwd=tmp_path)
    assert (code, out) == (2, "")
    assert said in err, err


async def test_api_status_holds_everything_status_shows(daemon: Daemon) -> None:
    doc = await daemon.overview()
    assert {"health", "now", "started_at", "silences", "ladders", "fallbacks", "waiting", "rules"} <= set(doc)
    assert {row["window"] for row in doc["rules"]} == {120.0, 300.0}


async def test_a_store_that_stalls_leaves_its_part_out_and_says_so(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Health checks and on-call read the status when things go wrong: a hung disk must not hold it."""
    monkeypatch.setattr(overview, "STORE_WAIT", 0.2)

    class Stalled:
        path = daemon.store.path
        asked = 0

        async def hang(self, *_: object) -> None:
            self.asked += 1
            await asyncio.sleep(3600)

        call = memory_read = hang

    store = Stalled()
    started = time.monotonic()
    doc = await overview.gather(
        daemon.status(),
        daemon.health(),
        store,
        daemon.dispatcher.actions,
        time.time(),
        daemon.started_at,  # type: ignore[arg-type]
    )
    assert time.monotonic() - started < 10  # not the hour the store would take
    assert store.asked == 1 and doc["silences"] is None  # the deadline is for the whole of the store's part
    assert doc["store"]["read_error"] == (
        "silences: the store did not answer within 0.2s; fallback: the store did not answer within 0.2s; "
        "shrink: the store did not answer within 0.2s"
    )
    assert doc["rules"] and doc["health"]["healthy"] is True  # what is in memory is still shown


async def test_a_flag_that_cannot_be_written_is_degraded_exit_5_with_its_error_until_it_heals(
    tmp_path: Path,
) -> None:
    """The flag API answers 500: /api/status, `specguard status`, the page and /metrics say that the
    fallback cannot be written, since when, the last error and the next try; once the API answers,
    the flag is written once and all of it is gone."""
    with HostileDeps() as deps:
        deps.set("/flag", "error500")
        flag = (
            f"    http: {{url: '{deps.url('/flag/spec')}', engage: {{speculative: false}}, "
            "restore: {speculative: true}, retries: 0, request_timeout: 5s}\n"
            "    retry_backoff: 1s\n    retry_max_backoff: 1s\n"
        )
        running = start_in(tmp_path, CONFIG.replace(
            "    file: {path: flags.json, engage: {speculative: false}, restore: {speculative: true}}\n", flag
        ))  # fmt: skip
        running.source = Readings(0.2)  # acceptance_low fires: the fallback is wanted engaged
        await running.start(handle_signals=False)
        try:
            await until(lambda: deps.count("/flag/spec", "PUT") >= 2, "the flag API asked twice")
            code, out, err = await specguard("status", "--url", url(running))
            doc = await running.overview()
            page = await _get(url(running) + "/")
            metrics = await _get(url(running) + "/metrics")

            deps.heal()
            await until(lambda: running.status()["fallbacks"]["fallback"]["failing_since"] is None, "healed")
            healed_code, healed_out, _ = await specguard("status", "--url", url(running))
            healed = await running.overview()
            healed_metrics = await _get(url(running) + "/metrics")
            writes = deps.served_count("/flag/spec", "PUT")
        finally:
            await running.shutdown()

    assert code == 5, err
    lines = out.splitlines()
    assert lines[0].endswith(": degraded, 1 firing (acceptance_low)")
    assert lines[1].startswith("  ! fallback fallback cannot be written: engage: ")
    assert "500" in lines[1]
    notes = out[out.index("Fallbacks") :]
    assert "changes failing since " in notes and "write(s) failed in a row" in notes and "next try " in notes
    assert "Actions" in lines
    shown = doc["fallbacks"]["fallback"]
    assert shown["is"] == "unknown" and shown["should_be"] == "engaged"
    assert shown["failures"] >= 1 and shown["failing_since"] <= shown["last_error_at"] <= doc["now"]
    assert "500" in shown["last_error"] and shown["next_try"] > shown["last_error_at"]
    assert doc["actions"]["fallback"]["type"] == "feature_flag"
    assert doc["actions"]["log"]["type"] == "log"
    assert "fallback fallback cannot be written" in page and "changes failing since" in page
    assert 'specguard_action_failing{action="fallback"}' in metrics
    assert _sample(metrics, 'specguard_action_failing{action="fallback"}') >= 1

    assert healed_code == 0, healed_out
    assert writes == 1  # written exactly once when it could be
    assert healed["fallbacks"]["fallback"]["is"] == "engaged"
    assert healed["fallbacks"]["fallback"]["failures"] == 0
    assert healed["fallbacks"]["fallback"]["last_error"] is None
    assert _sample(healed_metrics, 'specguard_action_failing{action="fallback"}') == 0


async def _get(address: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(address) as answer:
        assert answer.status == 200
        return await answer.text()


def _sample(page: str, name: str) -> float:
    (line,) = [line for line in page.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])
