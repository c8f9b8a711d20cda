"""specguard behind the real Prometheus and Alertmanager (Debian packages), fed by its own exports.

Prometheus evaluates `specguard export prometheus-rules` every second, Alertmanager is configured
with `specguard export alertmanager-receiver` exactly as printed, and `specguard run` receives the
webhooks. Acceptance collapses: the alert reaches specguard, which runs the alert rule's action once
although Alertmanager repeats itself every few seconds. specguard is then killed while Alertmanager
keeps sending, acceptance recovers meanwhile, and after a restart the resolution arrives: nothing
lost, nothing doubled.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.alert_pipeline import running_pipeline

pytestmark = pytest.mark.real


def metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


async def test_an_alert_from_alertmanager_acts_once_and_survives_a_kill(tmp_path: Path) -> None:
    async with running_pipeline(tmp_path) as pipe:
        # healthy first: specguard's own reading says so
        await pipe.daemon.wait_for(
            lambda s: any(r["rule"] == "acceptance_low" and r["verdict"] == "ok" for r in s["rules"]),
            timeout=60,
        )
        pipe.degrade()
        await pipe.wait(
            "the alert rule fires on Alertmanager's alert", lambda: pipe.runs("am_acceptance_low")
        )
        # Alertmanager repeats the firing group every few seconds (repeat_interval 4s): wait for
        # two repeats, each a duplicate that changes nothing
        await pipe.wait(
            "Alertmanager repeats the notification",
            lambda: pipe.query("SELECT COUNT(*) FROM deliveries WHERE new_alerts = 0")[0][0] >= 2,
            timeout=60,
        )
        status, text = await pipe.daemon.get("/metrics")
        assert status == 200
        assert metric(text, "specguard_webhook_duplicate_alerts_total") >= 2
        assert [(kind, status) for kind, status, _ in pipe.runs("am_acceptance_low")] == [("firing", "ok")]
        events = pipe.events("am_acceptance_low")
        assert [kind for kind, _, _ in events] == ["pending", "firing"]
        assert all(
            trigger.startswith("alertmanager: acceptance_low firing (delivery ") for _, trigger, _ in events
        )
        # the direct path saw it too
        assert ("firing", "ok") in [(kind, status) for kind, status, _ in pipe.runs("acceptance_low")]

        # killed while Alertmanager keeps sending; acceptance recovers while it is down
        assert pipe.daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        deliveries_before = pipe.query("SELECT COUNT(*) FROM deliveries")[0][0]
        await pipe.next_failed_notification("a repeat of the firing alert fails against the dead port")
        pipe.recover()
        # Prometheus resolves the alert once the 5 s window holds good data; Alertmanager's
        # resolved notification then fails too, and is sent again later
        await pipe.wait("Prometheus resolves the alert", lambda: not pipe.alertmanager_active(), timeout=90)
        await pipe.next_failed_notification("the resolved notification fails against the dead port")
        pipe.start_daemon()
        await pipe.wait(
            "the resolution reaches the restarted specguard",
            lambda: [kind for kind, _, _ in pipe.runs("am_acceptance_low")] == ["firing", "resolved"],
            timeout=90,
        )
        await pipe.daemon.wait_for(lambda s: s["webhook"]["watched_alerts"]["firing"] == 0, timeout=30)

    assert pipe.query("SELECT COUNT(*) FROM deliveries")[0][0] > deliveries_before
    runs = pipe.runs("am_acceptance_low")
    assert [(kind, status) for kind, status, _ in runs] == [("firing", "ok"), ("resolved", "ok")]
    kinds = [kind for kind, _, _ in pipe.events("am_acceptance_low")]
    assert kinds == ["pending", "firing", "resolved"]
    # each alert state is stored once, however often it was sent
    receipts = pipe.query(
        "SELECT status, COUNT(*) FROM alert_receipts GROUP BY fingerprint, status, starts_at"
    )
    assert sorted(receipts) == [("firing", 1), ("resolved", 1)]
