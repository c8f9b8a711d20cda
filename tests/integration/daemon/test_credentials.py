"""Every secret specguard uses can be a systemd credential: `LoadCredential=NAME:PATH` in the unit,
`{credential: NAME}` in the config, read from `$CREDENTIALS_DIRECTORY/NAME`.

One daemon in its own process, as systemd runs it, with the four secrets in a credentials
directory and none in its config: Alertmanager's webhook token, the Prometheus bearer token, the
flag API's token and the Slack bot token. Each is shown to reach its peer (the peer sees it, or
refuses otherwise), and none appears in the log.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.sim.slack_api import TOKEN as SLACK_TOKEN
from specguard.sim.slack_api import SlackApi
from tests.am_payloads import alert, message
from tests.ports import free_port
from tests.processes import Daemon, specguard

SECRETS = {
    "am-token": "am-2b7f-webhook-secret",
    "prom-token": "prom-91c4-bearer-secret",
    "flag-token": "flag-5d0e-api-secret",
    "slack-bot-token": SLACK_TOKEN,  # the loopback Slack API accepts only its own token
}

CONFIG = """\
server:
  port: {port}
  webhook_token: {{credential: am-token}}
interval: 1s
state_dir: state
sources:
  prometheus:
    url: {prometheus}
    bearer_token: {{credential: prom-token}}
rules: [rules.yaml]
actions:
  fallback:
    type: feature_flag
    http:
      url: {flags}/flags/speculative
      engage: {{speculative: false}}
      restore: {{speculative: true}}
      token: {{credential: flag-token}}
    quiet_period: 1h
  oncall:
    type: slack
    token: {{credential: slack-bot-token}}
    channel: C0CREDTEST
    base_url: {slack}
    group_wait: 0s
"""
RULES = """\
rules:
  - name: acceptance_collapse
    signal: acceptance_rate
    window: 5s
    condition: "< 0.4"
    severity: critical
    actions: [fallback, oncall]
"""


class Peer:
    """A fake HTTP peer that records the Authorization header of every request."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        self.url = ""

    def seen(self, request: web.Request) -> None:
        self.authorizations.append(request.headers.get("Authorization"))


async def fake_prometheus(aiohttp_server: AiohttpServer) -> Peer:
    """Answers every instant query with one series at acceptance 0.1 (a collapse)."""
    peer = Peer()

    async def query(request: web.Request) -> web.Response:
        peer.seen(request)
        if request.headers.get("Authorization") != f"Bearer {SECRETS['prom-token']}":
            return web.json_response({"status": "error", "errorType": "auth", "error": "no"}, status=401)
        sample = {"metric": {"instance": "vllm-a:8000", "model_name": "m"}, "value": [time.time(), "0.1"]}
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": [sample]}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", query)
    server = await aiohttp_server(app, host="127.0.0.1")
    peer.url = f"http://127.0.0.1:{server.port}"
    return peer


async def fake_flags(aiohttp_server: AiohttpServer) -> Peer:
    peer = Peer()

    async def put(request: web.Request) -> web.Response:
        peer.seen(request)
        if request.headers.get("Authorization") != f"Bearer {SECRETS['flag-token']}":
            return web.Response(status=401)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_put("/flags/speculative", put)
    server = await aiohttp_server(app, host="127.0.0.1")
    peer.url = f"http://127.0.0.1:{server.port}"
    return peer


@pytest.fixture
async def credentials(tmp_path: Path) -> AsyncIterator[Path]:
    """A credentials directory as systemd makes one: a file per credential, read-only."""
    directory = tmp_path / "credentials"
    directory.mkdir(mode=0o700)
    for name, secret in SECRETS.items():
        (directory / name).write_text(secret + "\n")
        (directory / name).chmod(0o400)
    yield directory


def _env(credentials: Path) -> dict[str, str]:
    return {**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)}


async def _until(what: str, done: Callable[[], bool], daemon: Daemon, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert daemon.process is not None
        if daemon.process.poll() is not None:
            pytest.fail(f"specguard exited with {daemon.process.returncode}:\n{daemon.log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout:.0f} s:\n{daemon.log.read_text()[-3000:]}")
        await asyncio.sleep(0.1)


async def test_every_secret_comes_from_a_systemd_credential_and_reaches_its_peer(
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    slack: SlackApi,
    credentials: Path,
    daemons: list[Daemon],
) -> None:
    prometheus, flags = await fake_prometheus(aiohttp_server), await fake_flags(aiohttp_server)
    port = free_port()
    config = tmp_path / "specguard.yaml"
    config.write_text(CONFIG.format(port=port, prometheus=prometheus.url, flags=flags.url, slack=slack.url))
    (tmp_path / "rules.yaml").write_text(RULES)
    assert not [secret for secret in SECRETS.values() if secret in config.read_text()]

    daemon = Daemon(config, port, tmp_path / "specguard.log")
    daemons.append(daemon)
    daemon.start(env=_env(credentials))
    await _until("the fallback engaged through the flag API", lambda: bool(flags.authorizations), daemon)
    await _until("on-call told in Slack", lambda: bool(slack.posted()), daemon)

    assert set(prometheus.authorizations) == {f"Bearer {SECRETS['prom-token']}"}
    assert set(flags.authorizations) == {f"Bearer {SECRETS['flag-token']}"}
    assert slack.posted()[0]["channel"] == "C0CREDTEST"  # accepted: the API checks its bearer token

    async with aiohttp.ClientSession() as session:
        body = message(alert({"alertname": "AcceptanceLow", "instance": "vllm-a:8000"}))
        for token, expected in ((SECRETS["am-token"], 200), ("wrong-token", 401), (None, 401)):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with session.post(f"{daemon.url}/alertmanager", json=body, headers=headers) as answer:
                assert answer.status == expected, (token, await answer.text())

    assert daemon.stop() == 0
    log = daemon.log.read_text()
    assert not [name for name, secret in SECRETS.items() if secret in log]


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("am-token", "server.webhook_token"),
        ("prom-token", "sources.prometheus.bearer_token"),
        ("flag-token", "actions.fallback.http.token"),
        ("slack-bot-token", "actions.oncall.token"),
    ],
)
async def test_a_missing_credential_is_named_with_its_field_and_line(
    tmp_path: Path, credentials: Path, name: str, field: str
) -> None:
    (credentials / name).unlink()
    config = tmp_path / "specguard.yaml"
    config.write_text(
        CONFIG.format(
            port=9464,
            prometheus="http://127.0.0.1:9",
            flags="http://127.0.0.1:9",
            slack="http://127.0.0.1:9/api/",
        )
    )
    (tmp_path / "rules.yaml").write_text(RULES)
    code, out, err = await specguard("check", "--config", str(config), env=_env(credentials))
    assert code == 1, out + err
    lines = [line for line in (out + err).splitlines() if f"credential {name}" in line or name in line]
    assert lines, out + err
    line = lines[0]
    assert line.startswith(f"{config}:"), line
    assert field in line and "cannot read it" in line, line
    assert "Traceback" not in err
    assert not [secret for secret in SECRETS.values() if secret in out + err]


async def test_without_credentials_directory_a_credential_says_what_systemd_must_give(tmp_path: Path) -> None:
    config = tmp_path / "specguard.yaml"
    config.write_text("server:\n  webhook_token: {credential: am-token}\n")
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    code, out, err = await specguard("check", "--config", str(config), env=env)
    assert code == 1
    assert f"{config}:2: server.webhook_token: " in out + err
    assert "needs $CREDENTIALS_DIRECTORY (systemd sets it for a unit with LoadCredential=)" in out + err
