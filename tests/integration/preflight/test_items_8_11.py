"""Checklist items 8, 10 and 11 against real parts: the nginx of this host (``nginx -t`` on the
rendered router), the store as the daemon's report schedule writes it (report/weekly.py), runbook
pages served over HTTP and as files, and the Slack Web API on loopback (sim/slack_api.py). Each item
passes on a sound setup and fails when its precondition is broken on purpose. Item 9 (Prometheus)
is test_item_9_prometheus.py."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.pytest_plugin import AiohttpServer

from specguard.common.schedule import cron
from specguard.config.loading import load
from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.items import report, routing, runbook
from specguard.report import weekly
from specguard.sim.slack_api import TOKEN, SlackApi
from specguard.store.database import Store
from tests.nginx_router import require_nginx, routing_config

# A Wednesday noon: the last Monday 08:00 was 2026-11-30, the one before 2026-11-23.
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC).timestamp()
MONDAY = datetime(2026, 11, 30, 8, 0, tzinfo=UTC).timestamp()
WEEK = 7 * 86400.0


def write_config(directory: Path, **sections: Any) -> Path:
    """specguard.yaml in ``directory`` (JSON is YAML), its state in ``directory/state``."""
    path = directory / "specguard.yaml"
    path.write_text(json.dumps({"state_dir": "state", **sections}, indent=2))
    return path


def context(config: Path, now: float | None = None, notify_test: bool = False) -> Context:
    loaded = load(config)
    store = loaded.config.store_file()
    return Context(
        loaded, config, store if store.is_file() else None, now or time.time(), notify_test=notify_test
    )


def said(answer: Answer) -> str:
    return "\n".join(answer.evidence)


# --- 8: routing --------------------------------------------------------------------------------


def a_routing(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return routing_config("127.0.0.1:18000", "127.0.0.1:18001", tmp_path / "flag.json", **extra)


async def test_routing_passes_when_the_router_renders_and_nginx_accepts_it(tmp_path: Path) -> None:
    require_nginx()
    answer = await routing.check(context(write_config(tmp_path, routing=a_routing(tmp_path))))
    assert answer.status is Status.PASS, said(answer)
    assert "3 class(es)" in said(answer) and "nginx -t passed (nginx/" in said(answer)
    assert answer.fix is None


async def test_routing_fails_when_nginx_refuses_the_rendered_router(tmp_path: Path) -> None:
    require_nginx()
    broken = a_routing(tmp_path)
    broken["pools"]["standard"]["servers"] = ["no-such-host.invalid:8000"]  # nginx resolves upstreams
    answer = await routing.check(context(write_config(tmp_path, routing=broken)))
    assert answer.status is Status.FAIL, said(answer)
    assert "nginx -t refuses the rendered router" in said(answer)
    assert "no-such-host.invalid" in said(answer)
    assert answer.fix is not None and "specguard routing render" in answer.fix


async def test_routing_fails_for_a_class_naming_an_unknown_pool_with_the_loaders_words(
    tmp_path: Path,
) -> None:
    broken = a_routing(tmp_path)
    broken["classes"][0]["pool"] = "gpu_big"
    answer = await routing.check(context(write_config(tmp_path, routing=broken)))
    assert answer.status is Status.FAIL
    assert "no pool 'gpu_big'" in said(answer) and "specguard.yaml:" in said(answer)


async def test_routing_fails_without_a_routing_section(tmp_path: Path) -> None:
    answer = await routing.check(context(write_config(tmp_path)))
    assert answer.status is Status.FAIL
    assert "no routing: section" in said(answer)
    assert answer.fix is not None and "specguard routing render --config" in answer.fix


# --- 10: the weekly report ---------------------------------------------------------------------


async def schedule_seen(config: Path, since: float) -> Store:
    """The store as a daemon with ``report.schedule`` started at ``since`` leaves it (open)."""
    loaded = load(config)
    store = Store(loaded.config.store_file())
    await store.open()
    schedule = loaded.config.report
    assert schedule.schedule is not None
    await weekly.missed(
        store, cron(schedule.schedule, schedule.timezone), since, loaded.config.history.retention
    )
    return store


async def made(config: Path, store: Store, scheduled: float) -> list[Path]:
    """The scheduled report of ``scheduled``, made and recorded as the daemon does."""
    loaded = load(config)
    schedule = loaded.config.report
    assert schedule.schedule is not None
    done = await weekly.scheduled_report(
        store, cron(schedule.schedule, schedule.timezone), scheduled, schedule.period, ["json"],
        loaded.config.reports_dir(), None,
    )  # fmt: skip
    assert done is not None
    return done[1]


async def test_report_passes_when_the_last_scheduled_report_was_written(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await schedule_seen(config, MONDAY - 3 * WEEK)
    try:
        paths = await made(config, store, MONDAY)
    finally:
        await store.close()
    answer = await report.check(context(config, NOW))
    assert answer.status is Status.PASS, said(answer)
    assert "scheduled 2026-11-30 08:00 UTC" in said(answer) and str(paths[0]) in said(answer)


async def test_report_fails_when_the_last_scheduled_report_was_not_written(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await schedule_seen(config, MONDAY - 3 * WEEK)
    try:
        await made(config, store, MONDAY - WEEK)  # the week before's only
    finally:
        await store.close()
    answer = await report.check(context(config, NOW))
    assert answer.status is Status.FAIL, said(answer)
    assert "the last one due was scheduled for 2026-11-30 08:00 UTC" in said(answer)
    assert "it was not written" in said(answer)
    assert answer.fix is not None and "specguard report --config" in answer.fix


async def test_report_fails_when_the_files_of_the_last_report_are_gone(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await schedule_seen(config, MONDAY - 3 * WEEK)
    try:
        paths = await made(config, store, MONDAY)
    finally:
        await store.close()
    paths[0].unlink()
    answer = await report.check(context(config, NOW))
    assert answer.status is Status.FAIL
    assert f"its files are gone: {paths[0]}" in said(answer)


async def test_report_is_unknown_before_the_first_report_is_due(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    store = await schedule_seen(config, MONDAY + 3600)  # first seen after Monday's run
    await store.close()
    answer = await report.check(context(config, NOW))
    assert answer.status is Status.UNKNOWN, said(answer)
    assert "the next is due 2026-12-07 08:00 UTC" in said(answer)


async def test_report_fails_without_a_schedule_or_without_the_daemons_database(tmp_path: Path) -> None:
    answer = await report.check(context(write_config(tmp_path, report={"schedule": None}), NOW))
    assert answer.status is Status.FAIL and "report.schedule is null" in said(answer)
    answer = await report.check(context(write_config(tmp_path), NOW))
    assert answer.status is Status.FAIL and "the daemon has not run" in said(answer)


# --- 11: the runbook and Slack -------------------------------------------------------------------


@pytest.fixture
async def wiki(aiohttp_server: AiohttpServer) -> str:
    """A runbook site: /runbook answers 200, /moved 302, anything else 404 (and HEAD is refused
    on /get-only, as some servers do)."""

    async def page(request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/get-only" and request.method == "HEAD":
            return web.Response(status=405)
        if path in ("/runbook", "/get-only"):
            return web.Response(text="<h1 id='acceptance_low'>acceptance</h1>", content_type="text/html")
        if path == "/moved":
            raise web.HTTPFound("/runbook")
        return web.Response(status=404, text="not found")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}"


def slack_config(tmp_path: Path, api: SlackApi, rules: list[dict[str, Any]], token: str = TOKEN) -> Path:
    (tmp_path / "slack-token").write_text(token + "\n")
    (tmp_path / "rules.yaml").write_text(json.dumps({"rules": rules}))
    oncall = {"type": "slack", "token": {"file": "slack-token"}, "channel": "C0ONCALL", "base_url": api.url}
    return write_config(tmp_path, rules=["rules.yaml"], actions={"oncall": oncall})


def a_rule(name: str, runbook_url: str | None, actions: tuple[str, ...] = ("oncall",)) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "name": name,
        "signal": "acceptance_rate",
        "condition": "< 0.5",
        "actions": list(actions),
    }
    if runbook_url is not None:
        rule["annotations"] = {"runbook_url": runbook_url}
    return rule


async def test_runbook_passes_when_every_acting_rules_link_resolves(
    tmp_path: Path, slack: SlackApi, wiki: str
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "runbook.md").write_text(
        "# Runbook\n\n## Acceptance low {#low}\n\n## KV cache: full\n"
    )
    rules = [
        a_rule("acceptance_low", f"{wiki}/runbook?severity={{severity}}#{{rule}}"),
        a_rule("acceptance_moved", f"{wiki}/moved"),
        a_rule("acceptance_get", f"{wiki}/get-only"),
        a_rule("acceptance_file", "docs/runbook.md#low"),
        a_rule("acceptance_heading", "docs/runbook.md#kv-cache-full"),
        a_rule("only_logged", None, actions=("log",)),  # acts on nothing: needs no runbook
    ]
    answer = await runbook.check(context(slack_config(tmp_path, slack, rules)))
    assert answer.status is Status.PASS, said(answer)
    text = said(answer)
    assert "5 rule(s) act beyond logging" in text
    assert f"acceptance_low: {wiki}/runbook?severity=warning#acceptance_low: HTTP 200" in text
    assert f"acceptance_moved: {wiki}/moved: HTTP 302" in text
    assert f"acceptance_get: {wiki}/get-only: HTTP 200" in text
    assert "has #low" in text and "has #kv-cache-full" in text
    assert "Slack not tested: --notify-test posts a test message through actions.oncall" in text
    assert slack.calls == []  # nothing posted without --notify-test


async def test_runbook_fails_for_a_rule_without_a_link_or_with_a_broken_one(
    tmp_path: Path, slack: SlackApi, wiki: str
) -> None:
    (tmp_path / "runbook.md").write_text("# Runbook\n\n## Acceptance\n")
    rules = [
        a_rule("no_link", None),
        a_rule("gone", f"{wiki}/deleted-page"),
        a_rule("no_anchor", "runbook.md#kv-cache"),
        a_rule("no_file", "missing.md"),
        a_rule("no_host", "https://runbooks.invalid/x"),
        a_rule("per_series", "https://runbooks.example/{labels[instance]}"),
    ]
    answer = await runbook.check(context(slack_config(tmp_path, slack, rules)))
    assert answer.status is Status.FAIL
    text = said(answer)
    assert "no_link (oncall): no runbook_url annotation" in text
    assert f"gone: {wiki}/deleted-page: HTTP 404" in text
    assert "no_anchor: file " in text and "has no anchor #kv-cache" in text
    assert "no_file: no such file: " in text
    assert "no_host: https://runbooks.invalid/x: no such host" in text
    assert "per_series: runbook_url depends on the firing" in text
    assert answer.fix is not None and "runbook_url" in answer.fix


async def test_runbook_fails_when_no_rule_acts_beyond_logging(tmp_path: Path) -> None:
    answer = await runbook.check(context(write_config(tmp_path)))  # the shipped pack: log only
    assert answer.status is Status.FAIL
    assert "no enabled rule acts beyond `log`" in said(answer)


async def test_notify_test_posts_a_message_to_the_channel_and_deletes_it(
    tmp_path: Path, slack: SlackApi, wiki: str
) -> None:
    config = slack_config(tmp_path, slack, [a_rule("acceptance_low", f"{wiki}/runbook")])
    answer = await runbook.check(context(config, notify_test=True))
    assert answer.status is Status.PASS, said(answer)
    assert [name for name, _, _ in slack.calls] == ["chat.postMessage", "chat.delete"]
    (deleted,) = slack.deleted
    assert deleted["channel"] == "C0ONCALL" and "test" in deleted["text"]
    assert slack.messages == []  # nothing left in the channel
    assert f"posted to C0ONCALL as {deleted['ts']}, and deleted" in said(answer)


async def test_notify_test_fails_when_slack_refuses_the_token(
    tmp_path: Path, slack: SlackApi, wiki: str
) -> None:
    config = slack_config(
        tmp_path, slack, [a_rule("acceptance_low", f"{wiki}/runbook")], token="xoxb-revoked"
    )
    answer = await runbook.check(context(config, notify_test=True))
    assert answer.status is Status.FAIL
    assert "--notify-test through actions.oncall: not posted: chat.postMessage: invalid_auth" in said(answer)
    assert "xoxb-revoked" not in said(answer) + (answer.fix or "")  # the token is never shown
    assert slack.messages == []


async def test_notify_test_fails_when_the_message_cannot_be_deleted(
    tmp_path: Path, slack: SlackApi, wiki: str
) -> None:
    config = slack_config(tmp_path, slack, [a_rule("acceptance_low", f"{wiki}/runbook")])
    slack.listeners.append(lambda kind, stored: stored.update(by="someone-else") if kind == "post" else None)
    answer = await runbook.check(context(config, notify_test=True))
    assert answer.status is Status.FAIL
    assert "but not deleted: chat.delete: cant_delete_message: delete it by hand" in said(answer)
    assert answer.fix is not None and "chat:write" in answer.fix
    assert len(slack.messages) == 1 and slack.deleted == []


async def test_the_simulated_chat_delete_answers_as_slack_does(slack: SlackApi) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:

        async def call(method: str, **body: Any) -> dict[str, Any]:
            async with session.post(slack.url + method, json=body) as response:
                answer: dict[str, Any] = await response.json()
                return answer

        posted = await call("chat.postMessage", channel="C0ONCALL", text="hello")
        assert await call("chat.delete", channel="C0ONCALL", ts="1.000000") == {
            "ok": False,
            "error": "message_not_found",
        }
        assert await call("chat.delete", channel="C0OTHER", ts=posted["ts"]) == {
            "ok": False,
            "error": "message_not_found",
        }
        assert await call("chat.delete", channel="C0ONCALL", ts=posted["ts"]) == {
            "ok": True,
            "channel": "C0ONCALL",
            "ts": posted["ts"],
        }
        assert slack.messages == [] and [m["text"] for m in slack.deleted] == ["hello"]
        assert (await call("chat.delete", channel="C0ONCALL", ts=posted["ts"]))[
            "error"
        ] == "message_not_found"
        slack.messages.append({"via": "api", "channel": "C0ONCALL", "ts": "9.000001", "by": "xoxb-other"})
        assert await call("chat.delete", channel="C0ONCALL", ts="9.000001") == {
            "ok": False,
            "error": "cant_delete_message",
        }


async def test_notify_test_through_an_incoming_webhook_posts_only(
    tmp_path: Path, slack: SlackApi, wiki: str
) -> None:
    (tmp_path / "rules.yaml").write_text(json.dumps({"rules": [a_rule("acceptance_low", f"{wiki}/runbook")]}))
    oncall = {"type": "slack", "webhook_url": {"file": "webhook-url"}}
    (tmp_path / "webhook-url").write_text(slack.webhook_url + "\n")
    config = write_config(tmp_path, rules=["rules.yaml"], actions={"oncall": oncall})
    answer = await runbook.check(context(config, notify_test=True))
    assert answer.status is Status.PASS, said(answer)
    assert "posted through its incoming webhook (it stays)" in said(answer)
    (posted,) = slack.webhook_posts
    assert "cannot delete it" in posted["text"]


async def test_a_link_that_depends_on_the_firing_is_unknown(
    tmp_path: Path, slack: SlackApi, wiki: str
) -> None:
    rules = [a_rule("ok", f"{wiki}/runbook"), a_rule("per_series", f"{wiki}/runbook/{{labels[instance]}}")]
    answer = await runbook.check(context(slack_config(tmp_path, slack, rules)))
    assert answer.status is Status.UNKNOWN, said(answer)
    assert answer.fix is not None and "without what only a firing knows" in answer.fix


async def test_notify_test_fails_without_a_slack_action(tmp_path: Path, wiki: str) -> None:
    (tmp_path / "rules.yaml").write_text(
        json.dumps({"rules": [a_rule("low", f"{wiki}/runbook", ("fallback",))]})
    )
    fallback = {
        "type": "feature_flag",
        "file": {"path": "flag.json", "engage": {"speculative": False}, "restore": {"speculative": True}},
    }
    config = write_config(tmp_path, rules=["rules.yaml"], actions={"fallback": fallback})
    answer = await runbook.check(context(config, notify_test=True))
    assert answer.status is Status.FAIL, said(answer)
    assert "--notify-test: the config has no slack action" in said(answer)
    assert answer.fix is not None and "add a slack action" in answer.fix
