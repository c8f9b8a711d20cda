"""`specguard demo` runs to completion by itself, as README command one promises, and shows the
whole loop with the real actions: the flag set and restored, the router following it (specguard's
nginx router, or the demo's own reading a flag file), the Slack thread on the loopback Web API,
history telling it afterwards, and the report of its minutes."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specguard.demo.report import Terminal, report_section
from specguard.demo.routers import Choice, PoolWatch, choose
from specguard.demo.scenario import CHANNEL, SPEEDUP, scaled_rules
from specguard.report import charts
from specguard.report.weekly import charts_missing
from tests.nginx_router import require_nginx

MILESTONES = {
    # the drop waits for the collapse detector to calibrate on the healthy traffic
    "calibrated": r"acceptance_collapse calibrated on the healthy traffic: in_control 0\.\d+ \(warm-up\), phi [\d.]+",
    "drop": r"traffic moves to temperature 1\.5",
    "detected": r"acceptance_collapse +pending -> firing +CUSUM G = [\d.]+ \(h = [\d.]+\)",
    "firing": r"acceptance_fallback +pending -> firing",
    "engaged": r"action fallback: ok: fallback engaged: ",
    "moved": r"router: .*traffic to standard decoding",
    "posted": rf"Slack {CHANNEL} received a message:",
    "calm": r"the hot traffic ends: temperature back to 0",
    "resolved": r"acceptance_fallback +firing -> resolved",
    "restored": r"action fallback \(restore\): ok: speculative decoding restored .*\(canary: acceptance "
    r"0\.\d+ over \d+ draft tokens \(4 requests\), at or above 0\.5\)",
    "back": r"router: .*traffic back to speculative decoding",
}
# How each router tells it: which router, the flag set, the traffic moved and back.
ROUTERS = {
    "builtin": {
        "router": r"--router builtin: the demo's own router",
        "engaged": r"action fallback: ok: fallback engaged: wrote \S+/flag\.json$",
        "moved": r"router: flag\.json says speculative: false -> traffic to standard decoding \(http://\S+\)$",
        "back": r"router: flag\.json says speculative: true -> traffic back to speculative decoding$",
    },
    "nginx": {
        "router": r"routing through nginx \d+\.\d+\.\d+ on 127\.0\.0\.1:\d+$",
        "engaged": r"action fallback: ok: fallback engaged: wrote \S+/routing-flag\.json; "
        r"PUT http://127\.0\.0\.1:\d+/specguard/flag: 200$",
        "moved": r"router: nginx sends traffic to standard decoding \(X-Specguard-Pool: standard\)$",
        "back": r"router: nginx sends traffic back to speculative decoding \(X-Specguard-Pool: speculative\)$",
    },
}


def demo(tmp_path: Path, router: str = "auto") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "specguard",
            "demo",
            "--no-color",
            "--state-dir",
            str(tmp_path),
            "--router",
            router,
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: the demo's own clock is checked below
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("router", ["builtin", "nginx"])
def test_the_demo_closes_the_loop_with_the_real_actions(tmp_path: Path, router: str) -> None:
    if router == "nginx":
        require_nginx()
    done = demo(tmp_path, router)
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    assert "\033[" not in out, "--no-color output carries escape codes"
    assert "Traceback" not in out + done.stderr
    lines = out.splitlines()
    # the baseline it measured gives every latency rule of the pack its figure
    (entry,) = json.loads((tmp_path / "baseline.json").read_text())["entries"]
    assert set(entry["signals"]) == {"e2e_latency_p95", "e2e_latency_mean"}, entry

    # Each milestone once, and in the order the loop goes (the output is written as things happen).
    at: dict[str, int] = {}
    for name, pattern in MILESTONES.items():
        found = [i for i, line in enumerate(lines) if re.search(rf"^\[ *\d+s\] {pattern}", line)]
        assert len(found) == 1, f"milestone {name!r} seen {len(found)} times in the demo's output:\n{out}"
        at[name] = found[0]
    order = f"milestones at lines {at}; the output:\n{out}"
    assert at["calibrated"] < at["drop"] < at["firing"] < at["engaged"] < at["moved"] < at["calm"], order
    # The collapse detector (logging only) sees the drop before the playbook rule does.
    assert at["drop"] < at["detected"] < at["firing"], order
    assert at["engaged"] < at["posted"], (
        order
    )  # the notice waits its group_wait, then says the fallback's outcome
    assert at["moved"] < at["resolved"] < at["restored"] < at["back"], order
    assert at["calm"] < at["restored"], order
    # In the words of the router it ran, named before the traffic starts.
    told = {}
    for name, pattern in ROUTERS[router].items():
        found = [i for i, line in enumerate(lines) if re.search(rf"^\[ *\d+s\] {pattern}", line)]
        assert len(found) == 1, f"{router}: {name!r} seen {len(found)} times in the demo's output:\n{out}"
        told[name] = found[0]
    assert (told["engaged"], told["moved"], told["back"]) == (at["engaged"], at["moved"], at["back"]), told
    assert lines[told["router"] + 1].endswith(
        "] traffic: 4 concurrent streams at temperature 0, through the router"
    )
    # The thread's first message, edited last: resolved, with the restore among its actions.
    edits = [
        i for i, line in enumerate(lines) if f"Slack {CHANNEL}: the thread's first message was edited" in line
    ]
    assert edits and edits[-1] > at["restored"], out
    last_edit = lines[edits[-1] + 1 : edits[-1] + 8]
    assert last_edit[0].strip() == "| RESOLVED · CRITICAL · acceptance_fallback", last_edit
    assert any(
        "• fallback (restore) at" in line and "speculative decoding restored" in line for line in last_edit
    )
    # the resolution in the rule's words for it: the traffic moved away, no data (no_data: ok here)
    assert re.search(
        r"a reply in the thread:\n +\| Resolved at \d\d:\d\d:\d\d UTC: Acceptance on \S+: no data, counted as ok "
        r"\(no_data: ok\): resolved",
        out,
    ), out

    # What the router's clients saw: collapsed speculation slower than standard decoding, which is
    # slower than healthy speculation; back to healthy once restored.
    latency = re.search(
        r"clients' p95: healthy ([\d.]+)s, collapsed ([\d.]+)s, on the fallback ([\d.]+)s, restored ([\d.]+)s",
        out,
    )
    assert latency, out
    healthy, collapsed, fallback, restored = map(float, latency.groups())
    assert collapsed > fallback > healthy and fallback > restored, latency.group(0)

    # The real files and the store.
    if router == "builtin":
        assert json.loads((tmp_path / "flag.json").read_text()) == {"speculative": True}
        assert json.loads((tmp_path / "flag.json.prev").read_text()) == {"speculative": False}
        assert not (tmp_path / "nginx").exists()
        assert re.search(r"^  traffic   \d+ requests: \d+ on speculative decoding, [1-9]\d* on standard "
                         r"decoding \(as the demo's router sent them\)", out, re.M), out  # fmt: skip
    else:
        check_nginx_run(tmp_path, out)
    with sqlite3.connect(tmp_path / "specguard.db") as db:
        runs = db.execute(
            "SELECT action, mode, status FROM action_runs WHERE action != 'log' ORDER BY event_id, action"
        ).fetchall()
        notes = [
            row[0] for row in db.execute("SELECT text FROM action_notes WHERE action='oncall' ORDER BY id")
        ]
        recorded = [row[0] for row in db.execute("SELECT instance FROM history_series")]
    assert runs == [
        ("fallback", "run", "ok"),
        ("oncall", "run", "ok"),
        ("fallback", "restore", "ok"),
        ("oncall", "run", "ok"),
    ], runs
    assert notes[0].startswith(f"notice 1 posted to {CHANNEL} (ts "), notes
    assert any(n.startswith("notice 2 replied in the thread: Resolved at") for n in notes), notes
    assert str(tmp_path / "specguard.db") in out

    # history tells the same story afterwards, the Slack deliveries under the firing
    shown = subprocess.run(
        [sys.executable, "-m", "specguard", "history", "--config", str(tmp_path / "specguard.yaml"),
         "--rule", "acceptance_fallback"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # in the order they were decided: the notices with the event, the flag by its controller after it
    assert re.search(r"firing -> resolved +schedule +log:ok, oncall:ok, fallback\(restore\):ok", shown), shown
    assert re.search(r"pending -> firing +schedule +log:ok, oncall:ok, fallback:ok", shown), shown
    assert re.search(rf"^ +\d\d:\d\d:\d\d oncall: notice 1 posted to {CHANNEL} \(ts ", shown, re.M), shown

    # The report of the demo's minutes, from the history the daemon recorded at each scrape of the
    # speculative server: after the loop and the summary, its headline figures, its files last.
    banner = re.search(r"^  speculative http://(127\.0\.0\.1:\d+)  ", out, re.M)
    assert banner, out
    instance = banner.group(1)
    assert recorded == [instance], recorded
    headers = [i for i, line in enumerate(lines) if line.startswith("report of the demo, ")]
    assert len(headers) == 1, out
    assert max(*at.values(), edits[-1]) < lines.index("summary") < headers[0], out
    section = lines[headers[0] + 1 :]
    server = re.fullmatch(
        rf"  server    tiny-llama on {re.escape(instance)}, k = 4: ([\d,]+) drafts in [12] minutes? of history",
        section[0],
    )
    assert server and int(server.group(1).replace(",", "")) > 0, section
    assert re.fullmatch(
        r"  accepted  \d+\.\d % of draft tokens, mean acceptance length \d\.\d\d \(healthy and collapsed together\)",
        section[1],
    ), section
    assert re.fullmatch(r"  fallback  1 to standard decoding, \d+\.\d s in fallback", section[2]), section
    # Each rule that fired, the most fired first. The detector and the fallback rule fire once; the
    # longer the collapsed traffic lasts on a slow machine, the more of the pack's other rules fire
    # beside them (acceptance_critical, whose 15 s once took one round too many), said the same way.
    assert section[3].startswith("  rules     "), section
    fired = {}
    for entry in section[3].removeprefix("  rules     ").split("; "):
        said = re.fullmatch(
            r"(\w+) (fired (\d+), resolved \d+(?:, acted \d+\.\d s after the breach began)?)", entry
        )
        assert said, section
        fired[said.group(1)] = said.group(2)
    order = [(-int(text.split()[1].rstrip(",")), name) for name, text in fired.items()]
    assert order == sorted(order), section
    acted = r"acted \d+\.\d s after the breach began"
    assert re.fullmatch(rf"fired 1, resolved [01], {acted}", fired.pop("acceptance_collapse")), section
    assert re.fullmatch(rf"fired 1, resolved 1, {acted}", fired.pop("acceptance_fallback")), section
    assert set(fired) <= {r["name"] for r in scaled_rules(SPEEDUP)["rules"]}, section
    missing = charts_missing()
    if missing is not None:
        assert section[4] == f"  charts    not included: {missing}", section
    html_line, md_line = section[-2:]  # the files are the demo's last lines
    html_path = re.fullmatch(r"  html      (\S+\.html)  \(one self-contained file\)", html_line)
    md_path = re.fullmatch(r"  markdown  (\S+\.md)  \((?:its 3 charts beside it|no charts)\)", md_line)
    assert html_path and md_path, section
    html, md = Path(html_path.group(1)), Path(md_path.group(1))
    assert html.parent == md.parent == tmp_path / "reports"
    page = html.read_text()
    assert instance in page
    assert "1 fallback to standard decoding, " in page
    assert not re.search(r"""(?:src|href)=["'](?!data:)""", page), "the HTML file loads something"
    if missing is None:
        assert page.count('<img src="data:image/png;base64,') == 3
    text = md.read_text()
    drafts = re.search(r"^\| Drafts \| ([\d,]+) \|", text, re.M)
    assert drafts and int(drafts.group(1).replace(",", "")) > 0, text
    images = re.findall(r"^!\[[^\]]*\]\(([^)]+\.png)\)$", text, re.M)
    assert len(images) == (3 if missing is None else 0), images
    assert all((md.parent / image).is_file() for image in images), images


def check_nginx_run(tmp_path: Path, out: str) -> None:
    """The nginx run: the flag restored in its file, the traffic's answers and nginx's own counters
    with requests on the standard pool (the fallback moved them), each request in the access log
    with its class and pool, nginx stopped, and the rendered router accepted by `specguard check`."""
    assert json.loads((tmp_path / "routing-flag.json").read_text()) == {"fallback": False}
    assert json.loads((tmp_path / "routing-flag.json.prev").read_text()) == {"fallback": True}
    assert not (tmp_path / "flag.json").exists()
    said = re.search(r"^  traffic   (\d+) requests: (\d+) on speculative decoding, (\d+) on standard decoding "
                     r"\(as each answer's X-Specguard-Pool header says\)", out, re.M)  # fmt: skip
    assert said, out
    requests, speculative, standard = map(int, said.groups())
    assert standard > 0 and speculative > 0 and speculative + standard == requests, said.group(0)
    counted = re.search(r"^  nginx     requests routed by pool, its /specguard/metrics: speculative (\d+), "
                        r"standard (\d+)$", out, re.M)  # fmt: skip
    assert counted, out
    # nginx also counts requests whose answers the traffic did not wait for when it stopped
    assert int(counted.group(1)) >= speculative and int(counted.group(2)) >= standard, counted.group(0)
    logged = (tmp_path / "nginx" / "logs" / "access.log").read_text().splitlines()
    pools = [re.search(r" class=(\S+) pool=(\S+) ", line) for line in logged]
    assert all(pools) and len(pools) >= requests, logged[:5]
    assert {m.groups() for m in pools if m} == {("default", "speculative"), ("default", "standard")}
    assert not (tmp_path / "nginx" / "nginx.pid").exists(), "nginx was left running"
    checked = subprocess.run(
        [sys.executable, "-m", "specguard", "check", "--config", str(tmp_path / "specguard.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_without_nginx_the_demo_says_so_or_refuses_router_nginx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nginx on it
    assert choose("auto") == Choice(None, None, "", "nginx is not installed")
    assert choose("builtin") == Choice(None, None, "", "--router builtin")
    assert choose("nginx") == "--router nginx: nginx is not installed"
    done = subprocess.run(
        [sys.executable, "-m", "specguard", "demo", "--router", "nginx", "--state-dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == "specguard demo: --router nginx: nginx is not installed\n"
    assert done.stdout == "" and not (tmp_path / "demo").exists()


def test_nginx_s_move_is_told_once_by_answers_to_requests_started_after_it() -> None:
    told: list[str] = []
    watch = PoolWatch("speculative", told.append)
    watch(1.0, "speculative")
    watch(3.0, "standard")  # the flag engaged: a request started at 3 s went to standard decoding
    watch(2.0, "speculative")  # sent before the move, answered after it: nothing new
    watch(4.0, "standard")
    watch(6.0, "speculative")  # restored
    watch(5.0, "standard")
    assert told == ["standard", "speculative"]


def test_ctrl_c_stops_the_demo_cleanly(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "specguard", "demo", "--no-color", "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (tmp_path / "specguard.db").exists():
            time.sleep(0.2)
        time.sleep(3)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, f"{out}\n{err}"
    assert "interrupted: everything stopped cleanly" in out
    assert not (tmp_path / "nginx" / "nginx.pid").exists(), "nginx (where it routes) was left running"
    assert "Traceback" not in out + err


def test_the_report_without_matplotlib_still_writes_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(charts, "available", lambda: charts.INSTALL)
    out = io.StringIO()
    now = time.time()
    written = asyncio.run(
        report_section(Terminal(out, color=False), tmp_path / "specguard.db", (now - now % 60, now), None,
                       "127.0.0.1:8000")
    )  # fmt: skip
    assert written
    lines = out.getvalue().splitlines()
    assert f"  charts    not included: {charts.INSTALL}" in lines, lines
    # An empty store (no history, nothing fired) reads plainly, without a division by zero.
    assert "  server    tiny-llama on 127.0.0.1:8000: no history was recorded for it" in lines, lines
    assert "  fallback  0 to standard decoding, 0.0 s in fallback" in lines, lines
    assert "  rules     none fired" in lines, lines
    html = re.fullmatch(r"  html      (\S+)  \(one self-contained file\)", lines[-2])
    md = re.fullmatch(r"  markdown  (\S+)  \(no charts\)", lines[-1])
    assert html and md, lines
    assert "Charts are not included: charts need matplotlib" in Path(html.group(1)).read_text()
    assert "Charts are not included: charts need matplotlib" in Path(md.group(1)).read_text()
    assert not list((tmp_path / "reports").glob("*.png"))
