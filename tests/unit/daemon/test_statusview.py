"""The status view: what `specguard status` prints and the page shows, from the daemon's
/api/status document (pure: the document in, the view out, times against the daemon's clock)."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest

from specguard.cli.status import print_view
from specguard.daemon.statustext import clock
from specguard.daemon.statusview import Condition, Tone, View, build

NOW = 1_796_000_000.0


def document() -> dict[str, Any]:
    """A daemon's status: one target up, a firing series, a pending one, a fallback engaged, a
    deferred run, a silence and a ladder."""
    return {
        "version": "1.2.3",
        "now": NOW,
        "started_at": NOW - 7200,
        "health": {"healthy": True, "status": "ok", "reason": None},
        "source": "scrape",
        "sources": {
            "warming_up": [],
            "targets": [
                {
                    "target": "http://vllm-a:8000/metrics",
                    "instance": "vllm-a:8000",
                    "state": "up",
                    "last_success": NOW - 2,
                    "last_error": None,
                    "error_since": None,
                    "failures": 0,
                },
            ],
        },
        "store": {"path": "/var/lib/specguard/specguard.db", "error": None, "bytes": 3 * 2**20},
        "webhook": {
            "path": "/alertmanager",
            "authenticated": True,
            "watched_alerts": {"firing": 1, "resolved": 0},
        },
        "dry_run": False,
        "last_evaluation": NOW - 1,
        "rules": [
            {
                "rule": "memory_pressure",
                "signal": "kv_cache_usage",
                "condition": "> 0.9",
                "window": 120.0,
                "labels": {"instance": "vllm-a:8000"},
                "state": "inactive",
                "value": 0.41,
                "threshold": 0.9,
                "verdict": "ok",
                "since": None,
                "error": None,
            },
            {
                "rule": "acceptance_low",
                "signal": "acceptance_rate",
                "condition": "< 0.5",
                "window": 300.0,
                "labels": {"instance": "vllm-a:8000", "model_name": "m"},
                "state": "pending",
                "value": 0.45,
                "threshold": 0.5,
                "verdict": "breach",
                "since": NOW - 30,
                "error": None,
            },
            {
                "rule": "acceptance_fallback",
                "signal": "acceptance_rate",
                "condition": "< 0.4",
                "window": 60.0,
                "labels": {"instance": "vllm-a:8000", "model_name": "m"},
                "state": "firing",
                "value": 0.21,
                "threshold": 0.4,
                "verdict": "breach",
                "since": NOW - 185,
                "error": None,
            },
        ],
        "fallbacks": {
            "fallback": {
                "should_be": "engaged",
                "why": 'held by acceptance_fallback{instance="vllm-a:8000"}',
                "holders": ['acceptance_fallback{instance="vllm-a:8000"}'],
                "restore_at": None,
                "is": "engaged",
                "is_since": NOW - 180,
            },
        },
        "waiting": [
            {
                "run": 7,
                "action": "oncall",
                "mode": "run",
                "status": "deferred",
                "rule": "acceptance_fallback",
                "labels": {"instance": "vllm-a:8000"},
                "event": "firing",
                "why": "silenced: by silence 2 until 15:00:00 (ops: draft swap)",
                "until": NOW + 600,
                "attempts": 0,
            },
        ],
        "silences": [
            {
                "id": 2,
                "rule": "acceptance_*",
                "match": {"instance": "vllm-a:8000"},
                "starts": NOW - 60,
                "ends": NOW + 600,
                "reason": "draft swap",
                "author": "ops",
                "created": NOW - 60,
                "expired": None,
                "state": "active",
            },
        ],
        "ladders": [
            {
                "action": "shrink",
                "ladder": [4, 2, 0],
                "k": 2,
                "file": "/etc/vllm/s.env",
                "file_k": 2,
                "change": None,
                "log": [{"at": NOW - 3600, "from": 4, "to": 2, "ok": True, "reason": "firing"}],
            },
        ],
    }


def section(view: View, title: str) -> Any:
    return next(s for s in view.sections if s.title.split(" (")[0] == title)


def text(view: View) -> str:
    out = io.StringIO()
    print_view(view, "http://127.0.0.1:9464", out)
    return out.getvalue()


def test_a_healthy_daemon_with_a_firing_rule_lists_it_first_with_value_threshold_verdict_and_since() -> None:
    view = build(document())
    assert view.condition is Condition.HEALTHY and view.problems == ()
    assert view.firing == ("acceptance_fallback",)
    rules = section(view, "Rules")
    assert rules.title == "Rules (3, 1 firing, 1 pending)"
    assert [row.cells[0].text for row in rules.rows] == [
        "acceptance_fallback",
        "acceptance_low",
        "memory_pressure",
    ]
    firing = rules.rows[0]
    cells = [cell.text for cell in firing.cells]
    assert cells[1:] == [
        "instance=vllm-a:8000,model_name=m", "firing", clock(NOW - 185, NOW), "0.21", "0.4", "breach", "1m",
    ]  # fmt: skip
    assert cells[3].endswith("(3m5s ago)")  # against the daemon's clock, not this machine's
    assert (firing.cells[2].tone, firing.cells[6].tone) == (Tone.BAD, Tone.BAD)
    assert dict(firing.data) == {"rule": "acceptance_fallback", "state": "firing"}


def test_flags_waiting_runs_silences_and_ladders_are_shown_with_what_holds_them() -> None:
    view = build(document())
    (flag,) = section(view, "Fallbacks").rows
    assert [c.text for c in flag.cells] == [
        "fallback",
        f"engaged since {clock(NOW - 180, NOW)}",
        "engaged",
        "-",
    ]
    assert flag.notes == ('held by acceptance_fallback{instance="vllm-a:8000"}',)
    (run,) = section(view, "Waiting runs").rows
    assert [c.text for c in run.cells][:6] == ["7", "oncall", "acceptance_fallback", "instance=vllm-a:8000",
                                              "firing", "deferred"]  # fmt: skip
    assert run.notes[0].startswith("silenced: by silence 2 until")
    (silence,) = section(view, "Silences").rows
    assert silence.silence == 2 and silence.cells[3].text == "active"
    assert silence.cells[4].text.endswith("(in 10m)")
    (ladder,) = section(view, "Ladders").rows
    assert [c.text for c in ladder.cells] == ["shrink", "2", "4 [2] 0", "k=2", "-"]
    assert ladder.notes[0].endswith("k 4 -> 2 ok: firing")


def test_a_daemon_that_says_it_is_unhealthy_is_unhealthy_with_its_reason() -> None:
    doc = document()
    doc["health"] = {"healthy": False, "status": "store_failing", "reason": "disk I/O error"}
    doc["store"]["error"] = "disk I/O error"
    view = build(doc)
    assert view.condition is Condition.UNHEALTHY
    assert view.problems == ("store_failing: disk I/O error",)
    facts = dict(view.facts)
    assert facts["Store"].text.endswith(": FAILING: disk I/O error") and facts["Store"].tone is Tone.BAD


def test_a_target_down_or_a_rule_in_error_makes_it_degraded_and_says_which() -> None:
    doc = document()
    target = doc["sources"]["targets"][0]
    target.update(state="down", last_error="connection refused", error_since=NOW - 90, failures=12)
    doc["rules"][0].update(verdict="error", error="needs a baseline")
    view = build(doc)
    assert view.condition is Condition.DEGRADED
    assert view.problems == (
        "target vllm-a:8000 is down: connection refused",
        "rule memory_pressure is in error",
    )
    (row,) = section(view, "Targets").rows
    assert row.cells[1].tone is Tone.BAD
    assert row.notes == (f"connection refused since {clock(NOW - 90, NOW)} (12 failed scrape(s) in all)",)
    assert section(view, "Targets").title == "Targets (0/1 up)"


def test_unhealthy_outranks_degraded() -> None:
    doc = document()
    doc["health"] = {"healthy": False, "status": "stalled", "reason": "the 15s rules last ran 60s ago"}
    doc["sources"]["targets"][0].update(state="down", last_error="refused")
    assert build(doc).condition is Condition.UNHEALTHY


def test_a_daemon_that_does_not_report_silences_or_ladders_says_so_instead_of_none() -> None:
    doc = document()
    for key in ("silences", "ladders", "health", "now", "started_at"):
        del doc[key]
    view = build(doc)
    assert view.condition is Condition.HEALTHY
    assert section(view, "Silences").note == "not shown: this daemon does not report its silences"
    assert section(view, "Ladders").note == "not shown: this daemon does not report its ladders"
    store_unreadable = copy.deepcopy(document())
    store_unreadable["silences"] = None
    store_unreadable["store"]["read_error"] = "silences: database is locked"
    silences = section(build(store_unreadable), "Silences")
    assert silences.note == "not shown: silences: database is locked" and silences.rows == ()


@pytest.mark.parametrize("doc", [[], "ok", {"version": "1"}, {"rules": "none"}])
def test_a_document_that_is_not_a_status_is_refused(doc: Any) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        build(doc)


def test_the_text_is_a_headline_facts_and_aligned_tables_without_colour_when_asked() -> None:
    out = text(build(document()))
    lines = out.splitlines()
    assert lines[0] == "● specguard 1.2.3 at http://127.0.0.1:9464: healthy, 1 firing (acceptance_fallback)"
    assert "      Health: ok: every rule evaluated on schedule" in lines
    assert "       Store: /var/lib/specguard/specguard.db (3.0 MB): ok" in lines
    assert "\033[" not in out
    header = lines.index("Rules (3, 1 firing, 1 pending)") + 1
    assert lines[header].split() == [
        "RULE",
        "SERIES",
        "STATE",
        "SINCE",
        "(UTC)",
        "VALUE",
        "THRESHOLD",
        "VERDICT",
        "OVER",
    ]
    assert lines[header + 1].split()[:3] == [
        "acceptance_fallback",
        "instance=vllm-a:8000,model_name=m",
        "firing",
    ]
    # each value starts where its column's header does
    assert lines[header + 1].index("0.21") == lines[header].index("VALUE")
    assert "Silences (1)" in lines and "Waiting runs" in lines and "Ladders" in lines


def test_times_say_how_long_ago_or_how_soon() -> None:
    assert clock(NOW - 5, NOW).endswith(" (5s ago)")
    assert clock(NOW + 3 * 3600 + 1800, NOW).endswith(" (in 3h30m)")
    assert clock(NOW - 3 * 86400, NOW) == "2026-11-27 00:53 (3d ago)"
    assert clock(None, NOW) == "-"


def test_each_action_says_what_it_says_of_itself_and_a_failing_one_makes_it_degraded() -> None:
    doc = document()
    doc["actions"] = {
        "oncall": {
            "type": "slack",
            "state": {
                "backlog": 3,
                "failing": 1,
                "failed": 4,
                "last_error": "chat.postMessage: channel_not_found",
                "last_error_at": NOW - 60,
                "next_try": NOW + 20,
            },
        },
        "fallback": {"type": "feature_flag", "state": {}},
        "pager": {"type": "pager", "state": {"backlog": 0, "failing": False, "queue": "eu-1"}},
        "stalled": {"type": "slack", "state": None},
        "buggy": {"type": "slack", "state": "cannot be read: RuntimeError: boom"},
    }
    view = build(doc)
    assert view.condition is Condition.DEGRADED
    assert view.problems == (
        "action oncall is failing: 3 waiting, 1 failing, 4 failed in all; last error "
        f"{clock(NOW - 60, NOW)}: chat.postMessage: channel_not_found; next try {clock(NOW + 20, NOW)}",
    )
    rows = {row.cells[0].text: row.cells for row in section(view, "Actions").rows}
    assert list(rows) == ["buggy", "fallback", "oncall", "pager", "stalled"]
    assert [c.text for c in rows["oncall"]][:2] == ["oncall", "slack"] and rows["oncall"][2].tone is Tone.BAD
    assert rows["fallback"][2].text == "-"
    assert rows["pager"][2].text == "0 waiting, not failing; queue: eu-1"
    assert rows["stalled"][2].text == "-" and rows["stalled"][2].tone is Tone.MUTED
    assert rows["buggy"][2].text == "cannot be read: RuntimeError: boom"
    out = text(view)
    assert out.splitlines()[1].startswith(
        "  ! action oncall is failing: 3 waiting, 1 failing, 4 failed in all"
    )
    assert "Actions" in out.splitlines()

    doc["actions"]["oncall"]["state"]["failing"] = 0  # delivered since, or on its way to a retry
    assert build(doc).condition is Condition.HEALTHY
    rows = {row.cells[0].text: row.cells for row in section(build(doc), "Actions").rows}
    assert rows["oncall"][2].text.startswith("3 waiting, 0 failing, 4 failed in all; last error")


def test_a_fallback_that_cannot_be_written_says_since_when_why_and_when_next() -> None:
    doc = document()
    doc["fallbacks"]["fallback"].update(
        {
            "is": "unknown",
            "failures": 4,
            "canary_failures": 0,
            "failing_since": NOW - 300,
            "last_error": "engage: PUT http://flags/spec failed 4 times, last: 500",
            "last_error_at": NOW - 10,
            "next_try": NOW + 50,
        }
    )
    view = build(doc)
    assert view.condition is Condition.DEGRADED
    assert view.problems == (
        "fallback fallback cannot be written: engage: PUT http://flags/spec failed 4 times, last: 500",
    )
    (flag,) = section(view, "Fallbacks").rows
    assert flag.cells[1].tone is Tone.BAD
    assert flag.notes[-1] == (
        f"changes failing since {clock(NOW - 300, NOW)}, 4 write(s) failed in a row; last error "
        f"{clock(NOW - 10, NOW)}: engage: PUT http://flags/spec failed 4 times, last: 500; "
        f"next try {clock(NOW + 50, NOW)}"
    )
    # a canary that keeps the fallback engaged is doing its job: shown, not a failure
    doc["fallbacks"]["fallback"].update(
        {
            "is": "engaged",
            "failures": 0,
            "canary_failures": 2,
            "last_error": "restore: canary: acceptance 0.31",
        }
    )
    view = build(doc)
    assert view.condition is Condition.HEALTHY
    assert "2 canary probe(s) kept it engaged" in section(view, "Fallbacks").rows[0].notes[-1]


def test_a_daemon_that_does_not_report_its_actions_says_so() -> None:
    view = build(document())
    assert section(view, "Actions").note == "not shown: this daemon does not report its actions"


def test_a_fleet_store_that_cannot_be_reached_makes_it_degraded_and_says_since_when() -> None:
    doc = document()
    doc["fleet"] = {"store": "redis", "url": "redis://10.0.0.5:6379/0", "host": "gpu-7",
                    "unreachable_since": doc["now"] - 90, "last_error": "Connection refused"}  # fmt: skip
    view = build(doc)
    assert view.condition is Condition.DEGRADED
    assert "the fleet's redis cannot be reached: no new restart or fallback" in view.problems
    fact = dict(view.facts)["Fleet"]
    assert fact.tone is Tone.BAD and fact.text.startswith(
        "redis redis://10.0.0.5:6379/0 as gpu-7: CANNOT BE REACHED since"
    )
    assert fact.text.endswith(": Connection refused; no new restart or fallback meanwhile"), fact.text
    doc["fleet"]["unreachable_since"] = None
    view = build(doc)
    assert (
        view.condition is Condition.HEALTHY
        and dict(view.facts)["Fleet"].text == "redis redis://10.0.0.5:6379/0 as gpu-7: ok"
    )
    del doc["fleet"]
    assert "Fleet" not in dict(build(doc).facts)  # no coordination: section, nothing said
