"""The HTML report in a real browser (Debian's headless Chromium): every chart inlined in it
decodes and shows, the page logs nothing to the console (no script error, no load that its
Content-Security-Policy blocked), and a screenshot of it is kept for a person to look at. Both the
example week (a fixture with every section filled) and a report built from history the way the
daemon builds it.

The screenshot goes to ``$SPECGUARD_ARTIFACTS`` (default ``tests/artifacts/``), with the HTML it
was taken from; the directory is not cleaned up and not committed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specguard.report import charts, render, weekly
from specguard.store import history
from specguard.store.baseline import parse_baseline
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from tests.real import missing, require_binary
from tests.week import Conditions, Server, Timeline

pytestmark = pytest.mark.real

FIXTURE = Path(__file__).parents[2] / "fixtures" / "report-week.json"
ARTIFACTS = Path(os.environ.get("SPECGUARD_ARTIFACTS") or Path(__file__).parents[2] / "artifacts")
PNG = b"\x89PNG\r\n\x1a\n"

# Run in the page once everything has loaded: records in the DOM whether each image decoded, for
# --dump-dom to show (a headless browser has no other channel back but its console).
CHECK_IMAGES = """addEventListener("load", () => {
  const images = Array.from(document.images);
  const broken = images.filter((image) => !(image.complete && image.naturalWidth > 0));
  document.body.dataset.images = (broken.length ? "broken:" + broken.length + "/" : "ok:") + images.length;
});"""
POLICY = "default-src 'none';"


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_binary("chromium", "chromium")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example week's report as the HTML file ``specguard report`` writes, charts included."""
    unavailable = charts.available()
    if unavailable is not None:
        missing(unavailable)
    report = json.loads(FIXTURE.read_text(encoding="utf-8"))
    [path] = render.write(report, "html", tmp_path_factory.mktemp("report"))
    return path


def run(chromium: str, profile: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a profile of its own; as root it needs --no-sandbox. The console's
    messages go to stderr (--enable-logging) so the test can see them."""
    argv = [
        chromium,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile}",
        *arguments,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr[-3000:]}"
    return done


def console(stderr: str) -> list[str]:
    """The page's console messages in Chromium's log (it logs them all as INFO:CONSOLE, errors
    included), and uncaught errors; not its usual D-Bus and GPU complaints."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def with_image_check(html: str) -> str:
    """The page plus CHECK_IMAGES, allowed by its hash: the report's policy forbids every script,
    and a second policy could only forbid more."""
    assert POLICY in html, "the report no longer has the policy this test amends"
    digest = base64.b64encode(hashlib.sha256(CHECK_IMAGES.encode()).digest()).decode()
    html = html.replace(POLICY, f"{POLICY} script-src 'sha256-{digest}';", 1)
    return html.replace("</body>", f"<script>{CHECK_IMAGES}</script>\n</body>", 1)


def images_marker(chromium: str, tmp_path: Path, html: str) -> tuple[str, list[str]]:
    checked = tmp_path / "checked.html"
    checked.write_text(with_image_check(html), encoding="utf-8")
    done = run(chromium, tmp_path / "profile", "--dump-dom", checked.as_uri())
    found = re.findall(r'data-images="([^"]*)"', done.stdout)
    assert len(found) == 1, f"the check did not run: {done.stdout[-2000:]!r} {done.stderr[-2000:]}"
    return found[0], console(done.stderr)


def test_every_chart_in_the_html_report_shows_in_chromium(chromium: str, page: Path, tmp_path: Path) -> None:
    html = page.read_text(encoding="utf-8")
    count = html.count("<img ")
    assert count == 6  # three charts for each of the two series
    marker, messages = images_marker(chromium, tmp_path, html)
    assert marker == f"ok:{count}"
    assert messages == []


def test_the_image_check_sees_a_chart_that_does_not_decode(chromium: str, page: Path, tmp_path: Path) -> None:
    html = page.read_text(encoding="utf-8")
    # the second image's PNG cut short after its header: the browser loads nothing it can show
    first = html.index("data:image/png;base64,")
    second = html.index("data:image/png;base64,", first + 1) + len("data:image/png;base64,")
    end = html.index('"', second)
    broken = html[:second] + base64.b64encode(PNG + b"\x00" * 8).decode() + html[end:]
    marker, _ = images_marker(chromium, tmp_path, broken)
    assert marker == "broken:1/6"


def test_a_screenshot_of_the_html_report_is_kept_for_a_person(
    chromium: str, page: Path, tmp_path: Path
) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "report-screenshot.png"
    screenshot.unlink(missing_ok=True)  # what is there afterwards is this run's
    (ARTIFACTS / "report-screenshot.html").write_bytes(page.read_bytes())
    done = run(
        chromium,
        tmp_path / "profile",
        f"--screenshot={screenshot}",
        "--window-size=1280,4000",
        "--hide-scrollbars",
        page.as_uri(),
    )
    assert console(done.stderr) == []  # the report as shipped: nothing blocked, nothing failed
    data = screenshot.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000, f"{screenshot}: {len(data)} bytes"


def test_the_console_check_sees_what_the_reports_policy_blocks(
    chromium: str, page: Path, tmp_path: Path
) -> None:
    """A script and a remote image in the page: the report's policy blocks both, and Chromium says so
    on the console, where the other tests look for messages."""
    html = page.read_text(encoding="utf-8")
    html = html.replace(
        "</body>", '<script>document.title = "ran"</script><img src="http://127.0.0.1:9/x.png">\n</body>', 1
    )
    bad = tmp_path / "bad.html"
    bad.write_text(html, encoding="utf-8")
    done = run(chromium, tmp_path / "profile", "--dump-dom", bad.as_uri())
    messages = console(done.stderr)
    assert any("Content Security Policy" in line for line in messages), done.stderr[-3000:]
    assert "<title>ran</title>" not in done.stdout


async def test_a_report_built_from_history_shows_in_chromium(chromium: str, tmp_path: Path) -> None:
    """Two hours of a simulated server recorded by history, built and written as the daemon writes
    its weekly report: its charts decode and the console stays quiet."""
    unavailable = charts.available()
    if unavailable is not None:
        missing(unavailable)
    start = 1_796_000_400.0 - 1_796_000_400.0 % 3600
    server = Server(
        "vllm-a:8000",
        "model-a",
        4,
        lambda t: Conditions(alpha=0.3 if t >= start + 5400 else 0.8, load=1.0, kv=0.4),
    )
    timeline = Timeline([server])
    store = Store(tmp_path / "specguard.db")
    await store.open()
    try:
        scrapes: list[tuple[str, float, Any]] = []
        for minute in range(120):
            at = start + 60 * minute
            timeline.advance(server, at)
            scrapes.append((server.instance, at + 30, parse_exposition(timeline.exposition(server))))
        await store.call(lambda db: history.record(db, scrapes))
        baseline = parse_baseline(
            {"version": 2, "measured_at": "2026-12-01T00:00:00Z",
             "entries": [{"model": "model-a", "signals": {"e2e_latency_p95": 3.0, "itl_p50": 0.03},
                          "speculative": {"draft_cost": 0.1}}]}
        )  # fmt: skip
        report, (path,) = await weekly.make(store, start, start + 7200, ["html"], tmp_path / "out", baseline)
    finally:
        await store.close()
    (series,) = report["series"]
    assert series["k"] == 4 and series["per_position"]
    html = path.read_text(encoding="utf-8")
    count = html.count("<img ")
    assert count == 3  # acceptance over the period, per position, latency against the baseline
    marker, messages = images_marker(chromium, tmp_path, html)
    assert marker == f"ok:{count}"
    assert messages == []
