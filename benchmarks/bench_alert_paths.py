"""Time from an acceptance drop to specguard's action, on its two paths, with the same rule.

The pipeline of the integration test (tests/alert_pipeline.py): a simulated vLLM with speculative
decoding under steady traffic, Prometheus scraping it every second and evaluating specguard's
exported `acceptance_low` (5 s window, `< 0.5`) every second, Alertmanager from specguard's
exported receiver (group_wait 1s), and `specguard run` scraping the same simulator every second.

Each cycle moves the traffic to temperature 1.5 (acceptance falls from about 0.7 to about 0.04) and
records, from that moment:

- direct path: specguard's own `acceptance_low` action finished (its scrape, its evaluation);
- Alertmanager path: Prometheus's alert active (its `activeAt`), the webhook delivery received,
  and the action of the alert rule `am_acceptance_low` finished.

Then the traffic recovers and both paths resolve before the next cycle. The direct path is the
baseline; the ratio says what the detour through Prometheus and Alertmanager costs. Run:
    .venv/bin/python benchmarks/bench_alert_paths.py [--cycles 3] [--write benchmarks/results/alert_paths.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests/

from tests.alert_pipeline import Pipeline, running_pipeline


async def alert_active_at(pipe: Pipeline) -> float | None:
    """When Prometheus's `acceptance_low` became active (its firing alert), or None."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{pipe.prometheus_url}/api/v1/alerts") as answer,
    ):
        alerts = (await answer.json())["data"]["alerts"]
    for alert in alerts:
        if alert["labels"].get("alertname") == "acceptance_low" and alert["state"] == "firing":
            return datetime.fromisoformat(alert["activeAt"].replace("Z", "+00:00")).timestamp()
    return None


def first_after(rows: list[tuple[str, str, float]], kind: str, since: float) -> float | None:
    return next(
        (finished for k, status, finished in rows if k == kind and status == "ok" and finished >= since), None
    )


async def cycle(pipe: Pipeline) -> dict[str, float]:
    dropped = time.time()
    pipe.degrade()
    direct = await pipe.wait(
        "direct action", lambda: first_after(pipe.runs("acceptance_low"), "firing", dropped), timeout=120
    )
    via_am = await pipe.wait(
        "Alertmanager-path action",
        lambda: first_after(pipe.runs("am_acceptance_low"), "firing", dropped),
        timeout=120,
    )
    active = await alert_active_at(pipe)
    delivered = pipe.query(
        "SELECT MIN(received) FROM deliveries WHERE received >= ? AND status = 'firing' AND new_alerts > 0",
        dropped,
    )[0][0]
    recovered = time.time()
    pipe.recover()
    for rule in ("acceptance_low", "am_acceptance_low"):
        await pipe.wait(
            f"{rule} resolves",
            lambda rule=rule: first_after(pipe.runs(rule), "resolved", recovered),
            timeout=180,
        )
    return {
        "direct": direct - dropped,
        "prometheus_active": (active - dropped) if active else float("nan"),
        "delivered": (delivered - dropped) if delivered else float("nan"),
        "alertmanager": via_am - dropped,
    }


async def measure(cycles: int, directory: Path) -> list[dict[str, float]]:
    async with running_pipeline(directory) as pipe:
        await pipe.daemon.wait_for(
            lambda s: any(r["rule"] == "acceptance_low" and r["verdict"] == "ok" for r in s["rules"]),
            timeout=60,
        )
        results = []
        for index in range(cycles):
            result = await cycle(pipe)
            print(f"cycle {index + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in result.items()), flush=True)
            results.append(result)
        return results


def table(results: list[dict[str, float]]) -> str:
    def median(key: str) -> float:
        return statistics.median(r[key] for r in results)

    rows = [
        ("direct: specguard's scrape and rule, action done", "direct"),
        ("Alertmanager path: Prometheus alert active", "prometheus_active"),
        ("Alertmanager path: webhook delivery stored", "delivered"),
        ("Alertmanager path: alert rule's action done", "alertmanager"),
    ]
    lines = [
        f"{len(results)} acceptance drops on {os.cpu_count()} cores; seconds from the drop (traffic moved to "
        "temperature 1.5) to each step. Rule: acceptance_rate, 5 s window, `< 0.5`, evaluated every 1 s "
        "by specguard and by Prometheus; scrapes every 1 s; Alertmanager group_wait 1s; Prometheus "
        "--rules.alert.resend-delay=1s.",
        "",
        "| step | median | min | max | per cycle |",
        "|---|---|---|---|---|",
    ]
    for label, key in rows:
        values = [r[key] for r in results]
        each = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {label} | {median(key):.2f} | {min(values):.2f} | {max(values):.2f} | {each} |")
    ratio = median("alertmanager") / median("direct")
    lines += [
        "",
        f"The Alertmanager path took {ratio:.2f}x the direct path's time to the action "
        f"({median('alertmanager') - median('direct'):+.2f} s, median).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=3, help="acceptance drops to time (default 3)")
    parser.add_argument("--write", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        results = asyncio.run(measure(args.cycles, Path(directory)))
    text = table(results)
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(
            "# Acceptance drop to action: direct scrape path and Alertmanager path\n\n" + text + "\n"
        )


if __name__ == "__main__":
    main()
