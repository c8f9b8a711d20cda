"""The HTML report in a real browser (Debian's headless Chromium): every chart inlined in it
decodes and shows, the page logs nothing to the console (no script error, no load that its
Content-Security-Policy blocked), and a screenshot of it is kept for a person to look at.

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

import pytest

from report import charts, render
from tests.real import missing, require_binary

pytestmark = pytest.mark.real

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report-week.json"
ARTIFACTS = Path(os.environ.get("SPECGUARD_ARTIFACTS") or Path(__file__).parents[1] / "artifacts")
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
