"""The backtest's page (``--html``): what a reader finds on it for each rule and series, that a label
cannot inject markup, two runs side by side, and that without matplotlib it still has its tables
and says why the timelines are missing."""

from __future__ import annotations

import base64
import html
import io
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from specguard.backtest import page
from specguard.backtest.incidents import Episode
from specguard.backtest.judge import Judged, Trace
from specguard.backtest.plan import HISTORY, Plan, plans
from specguard.backtest.result import RuleResult
from specguard.backtest.run import Backtest
from specguard.config.loading import load
from specguard.report import charts
from specguard.store.records import SeriesState, State
from tests.real import missing

START = 1_796_083_200.0  # 2026-12-01 00:00 UTC
END = START + 2 * 3600
MINUTE = 60.0
HOSTILE = "<script>alert(1)</script>"
A = {"instance": "vllm-a:8000", "model_name": HOSTILE}
B = {"instance": "vllm-b:8000", "model_name": "llama-70b"}
PNG = b"\x89PNG\r\n\x1a\n"
FIGURE = re.compile(
    r'<figure><img src="data:image/png;base64,([^"]+)" alt="([^"]*)"><figcaption>([^<]*)</figcaption>'
)

RULES = """\
rules:
  - name: acceptance_low
    description: the draft stops paying for itself
    signal: acceptance_rate
    window: 30s
    interval: 30s
    condition: "< 0.5"
    actions: [log]
  - name: per_engine
    signal: acceptance_rate
    group_by: [instance, engine]
    condition: "< 0.5"
    actions: [log]
"""


@pytest.fixture
def rule_plans(tmp_path: Path) -> dict[str, Plan]:
    """The rules as a backtest from history plans them: their notes and a skipped rule's reason are
    the real ones."""
    (tmp_path / "specguard.yaml").write_text("state_dir: state\n")
    (tmp_path / "rules.yaml").write_text(RULES)
    loaded = load(tmp_path / "specguard.yaml", [str(tmp_path / "rules.yaml")])
    assert loaded.ok, loaded.problems
    return {p.name: p for p in plans(loaded, HISTORY)}


@pytest.fixture
def drawing() -> None:
    why = charts.available()
    if why is not None:  # skipped on a developer's machine; a failure where SPECGUARD_REQUIRE_REAL is set
        missing(why)


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib as on a host without the charts extra: every import of it fails."""
    for module in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def trace(labels: dict[str, str], states: Sequence[tuple[int, int, State, float]]) -> Trace:
    """A series evaluated every minute of the period: ``states`` are (from minute, to minute,
    state, value), and every other minute is inactive at 0.8; the threshold is 0.5."""
    out = Trace(dict(labels))
    for minute in range(int((END - START) // MINUTE)):
        state, value = next(((s, v) for a, b, s, v in states if a <= minute < b), (State.INACTIVE, 0.8))
        out.add(START + minute * MINUTE, SeriesState(labels, state, value=value, threshold=0.5))
    return out


def at(minute: int) -> float:
    return START + minute * MINUTE


def firing_run(rule_plans: dict[str, Plan]) -> Backtest:
    """A's acceptance falls at minute 40: pending three minutes, firing from 43 to 80, resolved;
    B never moves. per_engine is not replayed."""
    low = rule_plans["acceptance_low"]
    judged = Judged(low, evaluations=120)
    judged.traces = {
        "a": trace(
            A, [(40, 43, State.PENDING, 0.3), (43, 81, State.FIRING, 0.2), (81, 82, State.RESOLVED, 0.8)]
        ),
        "b": trace(B, []),
    }
    episode = Episode("acceptance_low", "a", A, at(40), at(43), at(81), at(43) + 2)
    actions = [
        {"action": "log", "mode": "engage", "status": "ok", "reason": None, "detail": None,
         "finished": at(43) + 2, "at": at(43), "event": "firing", "labels": A},
    ]  # fmt: skip
    result = RuleResult(low, judged, episodes=[episode], actions=actions)
    skipped = RuleResult(rule_plans["per_engine"], Judged(rule_plans["per_engine"]))
    return Backtest(START, END, HISTORY, rules=[result, skipped])


def quiet_run(rule_plans: dict[str, Plan]) -> Backtest:
    """The same period through a candidate under which nothing fired."""
    low = rule_plans["acceptance_low"]
    judged = Judged(low, evaluations=120)
    judged.traces = {"a": trace(A, []), "b": trace(B, [])}
    return Backtest(START, END, HISTORY, rules=[RuleResult(low, judged)])


def written(tmp_path: Path, runs: Sequence[tuple[str, Backtest]]) -> str:
    path = tmp_path / "backtest.html"
    page.write_page(path, runs)
    return path.read_text(encoding="utf-8")


def figures(text: str) -> list[tuple[bytes, str, str]]:
    """Each timeline on the page: its PNG, alt text and caption (unescaped)."""
    return [
        (base64.b64decode(png), html.unescape(alt), html.unescape(caption))
        for png, alt, caption in FIGURE.findall(text)
    ]


def series_name(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def test_each_rule_and_series_is_on_the_page_with_a_timeline_of_each_series(
    tmp_path: Path, rule_plans: dict[str, Plan], drawing: None
) -> None:
    text = written(tmp_path, [("rules.yaml", firing_run(rule_plans))])
    assert "<h3>acceptance_low</h3>" in text and "<h3>per_engine</h3>" in text
    assert "the draft stops paying for itself" in text
    drawn = figures(text)
    assert len(drawn) == 2  # one per series of the replayed rule; none for the rule not replayed
    names = (series_name(A), series_name(B))
    by_series = {
        name: (png, alt) for png, alt, caption in drawn for name in names if caption.startswith(name)
    }
    assert set(by_series) == set(names)  # each series captioned with its labels, once
    for png, _ in by_series.values():
        assert png.startswith(PNG)
    # the alt text says what the timeline shows: A's dip and its pending and firing stretches
    alt_a = by_series[series_name(A)][1]
    assert "value between 0.2 and 0.8" in alt_a and "threshold 0.5" in alt_a
    assert "pending 1 time, 3m in all" in alt_a and "firing 1 time, 38m in all" in alt_a
    assert "never pending or firing" in by_series[series_name(B)][1]
    # the timelines sit in their rule's section, before the next rule's
    assert text.index("<h3>acceptance_low</h3>") < text.index("<figure>") < text.index("<h3>per_engine</h3>")


def test_the_firings_table_gives_each_firing_its_times_and_first_action(
    tmp_path: Path, rule_plans: dict[str, Plan], drawing: None
) -> None:
    text = written(tmp_path, [("rules.yaml", firing_run(rule_plans))])
    firings = text[text.index("<h4>Firings</h4>") :]
    row = firings[: firings.index("</tr>", firings.index("<tbody>"))]
    for shown in ("2026-12-01 00:40:00", "2026-12-01 00:43:00", "2026-12-01 01:21:00", "38m", "2s"):
        assert f">{shown}</td>" in row
    # the series table: B read 0.8 at each of its 120 evaluations and never moved
    b_row = re.search(rf"<tr><td class=\"l\">{re.escape(html.escape(series_name(B)))}</td>(.*?)</tr>", text)
    assert b_row is not None
    cells = re.findall(r">([^<]*)</td>", b_row.group(1))
    assert cells == ["120", "0", "0.8", "0.5", "0s", "0s"]


def test_the_notes_of_what_history_cannot_replay_and_a_skipped_rules_reason_are_shown(
    tmp_path: Path, rule_plans: dict[str, Plan], no_matplotlib: None
) -> None:
    text = written(tmp_path, [("rules.yaml", firing_run(rule_plans))])
    notes = rule_plans["acceptance_low"].notes
    assert any("a dip shorter than a minute is averaged away" in note for note in notes)
    for note in notes:
        assert f"<li>{html.escape(note)}</li>" in text
    assert (
        '<p class="note">Not replayed: history keeps series by instance and model_name only, and this rule '
        "groups or selects by engine: replay it from Prometheus.</p>"
    ) in text


def test_a_label_holding_markup_shows_as_text_and_the_page_runs_nothing(
    tmp_path: Path, rule_plans: dict[str, Plan], drawing: None
) -> None:
    text = written(tmp_path, [("rules.yaml", firing_run(rule_plans))])
    assert HOSTILE not in text and "<script" not in text
    assert html.escape(HOSTILE) in text
    assert "default-src 'none'; img-src data:" in text
    assert not re.search(r"""(src|href)="(?!data:image/png;base64,)""", text)  # nothing loaded from elsewhere


def test_two_runs_are_set_side_by_side_each_then_in_full(
    tmp_path: Path, rule_plans: dict[str, Plan], drawing: None
) -> None:
    text = written(
        tmp_path, [("rules.yaml", firing_run(rule_plans)), ("candidate.yaml", quiet_run(rule_plans))]
    )
    assert "<title>specguard backtest: rules.yaml against candidate.yaml</title>" in text
    assert '<th class="r">rules.yaml</th><th class="r">candidate.yaml</th>' in text
    assert '<tr><td class="l">firings</td><td class="r">1</td><td class="r">0</td></tr>' in text
    assert '<tr><td class="l">rules not replayed</td><td class="r">1</td><td class="r">0</td></tr>' in text
    assert '<tr><td class="l">log runs</td><td class="r">1 ok</td><td class="r">\u2013</td></tr>' in text
    first, second = (
        text.index("<h2>Rules file rules.yaml</h2>"),
        text.index("<h2>Rules file candidate.yaml</h2>"),
    )
    assert first < second
    assert len(figures(text[first:second])) == 2 and len(figures(text[second:])) == 2
    assert "No firing." in text[second:] and "No firing." not in text[first:second]


def test_without_matplotlib_the_page_has_its_tables_and_says_why_it_has_no_timelines(
    tmp_path: Path, rule_plans: dict[str, Plan], no_matplotlib: None
) -> None:
    assert charts.available() == charts.INSTALL
    text = written(tmp_path, [("rules.yaml", firing_run(rule_plans))])
    assert "<img" not in text and "<figure>" not in text
    assert f'<p class="note">Charts are not included: {html.escape(charts.INSTALL)}.</p>' in text
    assert "<h4>Firings</h4>" in text and ">2026-12-01 00:43:00</td>" in text
    assert "<h4>Series</h4>" in text and html.escape(series_name(A)) in text and series_name(B) in text


def test_a_rule_of_many_series_draws_those_that_fired_and_says_how_many_are_left_out(
    tmp_path: Path, rule_plans: dict[str, Plan], drawing: None
) -> None:
    low = rule_plans["acceptance_low"]
    judged = Judged(low, evaluations=120)
    labels = [{"instance": f"vllm-{n:02}:8000", "model_name": "m"} for n in range(page.MOST_CHARTS + 3)]
    judged.traces = {str(n): trace(one, []) for n, one in enumerate(labels)}
    judged.traces["last"] = trace(labels[-1], [(10, 20, State.FIRING, 0.1)])  # sorts last, fired
    del judged.traces[str(len(labels) - 1)]
    text = written(tmp_path, [("rules.yaml", Backtest(START, END, HISTORY, rules=[RuleResult(low, judged)]))])
    captions = [caption for _, _, caption in figures(text)]
    assert len(captions) == page.MOST_CHARTS
    assert any(caption.startswith(series_name(labels[-1])) for caption in captions)
    assert "Timelines of 3 more series are left out" in text
    assert all(series_name(one) in text for one in labels)  # every series keeps its row


def test_the_page_replaces_the_file_whole(
    tmp_path: Path, rule_plans: dict[str, Plan], no_matplotlib: None
) -> None:
    path = tmp_path / "out" / "backtest.html"
    path.parent.mkdir()
    path.write_text("the previous page")
    page.write_page(path, [("rules.yaml", firing_run(rule_plans))])
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in path.parent.iterdir()] == ["backtest.html"]  # no temporary file, no .prev


def pixels(png: bytes) -> Any:
    """The PNG as rows of RGB values between 0 and 1."""
    from matplotlib.image import imread

    return imread(io.BytesIO(png), format="png")[:, :, :3]


def columns_of(row: Any, colour: tuple[float, float, float]) -> list[int]:
    return [
        x
        for x, rgb in enumerate(row)
        if all(abs(c - want) < 0.03 for c, want in zip(rgb, colour, strict=True))
    ]


def test_a_timeline_shades_pending_then_firing_where_they_were(drawing: None) -> None:
    """Pending for minutes 20 to 30 of 100, firing for 30 to 50: across the middle of the image the
    firing shade covers twice the width of the pending one, to its right."""
    states = ["pending" if 20 <= m < 30 else "firing" if 30 <= m < 50 else "inactive" for m in range(100)]
    chart = charts.timeline(
        [at(m) for m in range(100)], [1.0] * 100, [0.0] * 100, states, "t", "v", (at(0), at(100))
    )
    assert chart is not None
    image = pixels(chart[0])
    row = image[image.shape[0] // 2]
    # each shade over white: 1 - opacity x (1 - its colour)
    pending = columns_of(row, (0.966, 0.902, 0.762))
    firing = columns_of(row, (0.946, 0.827, 0.818))
    assert pending and firing
    assert max(pending) < min(firing)
    assert 1.8 < len(firing) / len(pending) < 2.2


def test_a_weeks_timeline_keeps_a_one_minute_dip_and_stays_small(drawing: None) -> None:
    """10,080 evaluations are thinned for drawing, but not by dropping points: a dip of one minute
    to 0 among values of 1 still reaches the bottom of the chart."""
    values = [1.0] * 10_080
    values[5_003] = 0.0
    chart = charts.timeline([at(m) for m in range(10_080)], values, [math.nan] * 10_080, ["inactive"] * 10_080,
                            "t", "v")  # fmt: skip
    assert chart is not None
    png, alt = chart
    assert len(png) < 100_000
    assert "value between 0 and 1" in alt and "never pending or firing" in alt
    image = pixels(png)
    line = (0x1F / 255, 0x6F / 255, 0xB4 / 255)
    rows = [y for y in range(image.shape[0]) if columns_of(image[y], line)]
    # the line at 1 near the top, and the dip's stroke down to the bottom of the axes
    assert rows and max(rows) - min(rows) > image.shape[0] / 2
