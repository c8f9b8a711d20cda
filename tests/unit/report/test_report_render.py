"""The weekly report's renderings: what a reader finds in them, that outside text cannot inject
markup, that the HTML needs nothing but itself, and that a host without matplotlib still gets a
report that says its charts are missing."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from specguard.report import charts, render
from specguard.report.model import HEADLINE
from tests.real import missing

FIXTURE = Path(__file__).parents[2] / "fixtures" / "report-week.json"
PNG = b"\x89PNG\r\n\x1a\n"
STEM = "report-2026-11-30-2026-12-07"
HOSTILE = "<script>alert(1)</script>"
DASH = "\u2013"  # what a null shows as: an en dash
TIMES = "\u00d7"  # the multiplication sign of 2.19x


def week() -> dict[str, Any]:
    """A fresh copy of the example report (tests change theirs)."""
    report: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return report


@pytest.fixture(scope="module")
def drawn() -> list[charts.Chart]:
    why = charts.available()
    if why is not None:  # skipped on a developer's machine; a failure where SPECGUARD_REQUIRE_REAL is set
        missing(why)
    return charts.charts(week())


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib as on a host without the charts extra: every import of it fails."""
    for module in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def section(text: str, heading: str) -> str:
    """The Markdown from ``heading`` to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n")
    following = re.search(rf"^#{{1,{level}}} ", text[start + len(heading) :], re.MULTILINE)
    return text[start : start + len(heading) + following.start()] if following else text[start:]


def test_the_markdown_names_every_series_and_gives_each_recommendation_with_its_reasoning() -> None:
    report = week()
    text = render.markdown(report, {})
    for series in report["series"]:
        assert f"## {series['model']} on {series['instance']}\n" in text
    recommendations = section(text, "## Recommendations")
    for recommendation in report["recommendations"]:
        assert f"### {recommendation['title']}\n" in recommendations
        for line in recommendation["reasoning"]:
            assert f"\n- {line}\n" in recommendations


def test_the_summary_gives_each_series_headline_with_its_change_as_an_arrow_and_a_signed_percentage() -> None:
    summary = section(render.markdown(week(), {}), "## Summary")
    assert (
        f"| llama-70b on 10.0.0.7:8000 | 41.4 % ▼ -8.2 % | 3.07 ▼ -5.8 % | 2.19{TIMES} ▼ -6.0 % "
        f"| 2.11 s vs 1.84 s ({TIMES}1.15) ▲ +7.6 % |"
    ) in summary
    # no draft cost, so no speedup: a dash, without a change
    assert f"| qwen2.5-32b-instruct on 10.0.0.8:8000 | 49.8 % ▼ -11.2 % | 2.49 ▼ -7.1 % | {DASH} |" in summary


def test_the_headline_table_shows_seconds_below_one_as_ms_and_ratios_as_percentages() -> None:
    headline = section(render.markdown(week(), {}), "### This period against the one before")
    assert "| TTFT p95 | 412 ms | 368 ms | ▲ +12.0 % |" in headline
    assert "| Inter-token latency p50 | 23 ms | 22 ms | ▲ +3.1 % |" in headline
    assert "| End-to-end latency p95 | 2.11 s | 1.96 s | ▲ +7.6 % |" in headline
    assert "| KV-cache usage, max | 93.0 % | 88.0 % | ▲ +5.7 % |" in headline
    assert "| Drafts | 176,904,739 | 183,981,000 | ▼ -3.9 % |" in headline
    rows = [line for line in headline.splitlines() if line.startswith("| ")][2:]  # after the header
    assert [row.split(" | ")[0] for row in rows][:2] == ["| Acceptance rate", "| Mean acceptance length"]
    assert len(rows) == len(HEADLINE)


def test_missing_values_show_as_a_dash_never_as_none_or_nan(drawn: list[charts.Chart]) -> None:
    report = week()
    text = render.markdown(report, {})
    assert f"| Estimated speedup | {DASH} | {DASH} | {DASH} |" in text  # qwen: no draft cost
    assert f"| KV-cache usage, max | 71.0 % | {DASH} | {DASH} |" in text  # no figure for the week before
    assert f"| TTFT p95 | 297 ms | {DASH} | {DASH} |" in text  # latency without a baseline
    assert f"draft cost per step c = {DASH} (no baseline entry" in text
    page = render.html(report, {chart.name: chart.png for chart in drawn})
    for shown in (text, page):
        assert not re.search(r"\b(None|nan|NaN|null)\b", shown)


def test_the_sections_come_in_the_report_s_order() -> None:
    text = render.markdown(week(), {})
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == [
        "## Summary",
        "## Recommendations",
        "## llama-70b on 10.0.0.7:8000",
        "## qwen2.5-32b-instruct on 10.0.0.8:8000",
        "## Rules fired",
        "## Fallbacks",
        "## Restarts and rung changes",
        "## Silences",
    ]
    series = section(text, "## llama-70b on 10.0.0.7:8000")
    assert [line for line in series.splitlines() if line.startswith("### ")] == [
        "### This period against the one before",
        "### By day",
        "### By hour of day (UTC)",
        "### Acceptance by draft position",
        "### Latency against the baseline",
    ]


def test_rules_fallbacks_restarts_and_silences_are_told_with_their_times() -> None:
    text = render.markdown(week(), {})
    rules = section(text, "## Rules fired")
    assert "| Rule | Severity | Fired | Period before | Resolved | Median time to act |" in rules
    assert "| acceptance_fallback | critical | 1 | 0 | 1 | 1.2 s |" in rules
    assert "| acceptance_low | warning | 3 | 5 | 2 | 41 s |" in rules
    assert f"| latency_regression | warning | 1 | 1 | 1 | {DASH} |" in rules  # no action: no time to act
    assert (
        "| 2026-12-02 14:09 UTC | acceptance_fallback | instance=10.0.0.7:8000, model_name=llama-70b | 0.187 "
        "| 2026-12-02 14:06 UTC | 2026-12-02 15:31 UTC | 1.2 s |"
    ) in rules
    fallbacks = section(text, "## Fallbacks")
    assert (
        "1 fallback to standard decoding, 1 h 30 min (5400 s) in fallback in total. The period before: 2, "
        "15 min in fallback."
    ) in fallbacks
    assert "| fallback | 2026-12-02 14:09 UTC | 2026-12-02 15:39 UTC | 1 h 30 min |" in fallbacks
    restarts = section(text, "## Restarts and rung changes")
    assert "| 2026-12-05 10:12 UTC | fewer_tokens | ok | 4 → 3 |" in restarts
    assert f"| 2026-12-06 03:00 UTC | restart | failed | {DASH} |" in restarts
    silences = section(text, "## Silences")
    assert "| latency_regression | 2026-12-03 16:30 UTC | 2026-12-03 18:00 UTC | load test" in silences


def test_each_firing_is_told_in_the_words_it_said_and_its_resolution_in_its_own() -> None:
    report = week()
    text = render.markdown(report, {})
    said = section(text, "### What the firings and their resolutions said")
    # only the firing that carries its messages (a report made before they were kept has none)
    assert said.strip().splitlines()[1:] == [
        "",
        "- 2026-12-02 14:09 UTC acceptance_fallback: Acceptance 0.19 below 0.4 for 3 evaluations in a "
        "row on 10.0.0.7:8000: the playbook's trigger to fall back to standard decoding; resolved "
        "2026-12-02 15:31 UTC: Acceptance 0.71 on 10.0.0.7:8000: back at or above 0.4",
    ]
    page = render.html(report, {})
    assert "<li>2026-12-02 14:09 UTC acceptance_fallback: Acceptance 0.19 below 0.4" in page
    for rule in report["rules"]:
        for firing in rule["firings"]:
            firing.pop("message", None)
    assert "What the firings" not in render.markdown(report, {})


def test_a_week_without_events_says_so_instead_of_showing_empty_tables() -> None:
    report = week()
    report.update(rules=[], fallbacks={"count": 0, "seconds": 0.0, "spans": []}, restarts=[], silences=[])
    report["recommendations"] = []
    text = render.markdown(report, {})
    for line in (
        "No recommendations for this period.",
        "No rule fired in this period.",
        "No fallback to standard decoding in this period.",
        "No restart in this period.",
        "No silence in this period.",
    ):
        assert f"\n{line}\n" in text


def test_the_html_is_one_file_that_loads_nothing_and_runs_nothing(drawn: list[charts.Chart]) -> None:
    page = render.html(week(), {chart.name: chart.png for chart in drawn})
    assert len(drawn) == 6  # three per series; both series have baselines
    assert 'src="http' not in page and "<script" not in page.lower() and "<link" not in page
    assert "url(" not in page and "@import" not in page
    sources = re.findall(r'<img src="([^"]*)"', page)
    assert len(sources) == len(drawn)
    for source in sources:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.removeprefix("data:image/png;base64,")).startswith(PNG)
    # and a browser would refuse anything else: the policy allows data: images and inline style only
    assert "content=\"default-src 'none'; img-src data:; style-src 'unsafe-inline'\"" in page


def test_a_hostile_model_name_and_reasoning_are_shown_as_text(drawn: list[charts.Chart]) -> None:
    report = week()
    report["series"][0]["model"] = HOSTILE
    report["host"] = 'gpu-"07"&<b>'
    report["recommendations"][0]["reasoning"].append("<img src=x onerror=alert(2)> | *bold* [link](http://x)")
    hostile = charts.charts(report)  # matplotlib gets the name too: drawn as text, not TeX or markup
    page = render.html(report, {chart.name: chart.png for chart in hostile})
    assert "<script" not in page and "<img src=x" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "gpu-&quot;07&quot;&amp;&lt;b&gt;" in page
    assert all(chart.name.replace("-", "").isalnum() for chart in hostile)  # file names stay plain
    text = render.markdown(report, {chart.name: f"{chart.name}.png" for chart in hostile})
    assert not re.search(r"(?<!\\)<", text)  # every "<" escaped: no raw HTML in a Markdown viewer
    assert "\\<script\\>alert(1)\\</script\\>" in text
    assert "\\<img src=x onerror=alert(2)\\> \\| \\*bold\\* \\[link\\](http://x)" in text


@pytest.fixture
def drawn_once(monkeypatch: pytest.MonkeyPatch, drawn: list[charts.Chart]) -> None:
    """The fixture's charts without drawing them again (a quarter of a second each)."""
    monkeypatch.setattr(charts, "charts", lambda report: drawn)


@pytest.mark.usefixtures("drawn_once")
def test_writing_markdown_puts_the_charts_beside_it_and_links_them_by_relative_name(tmp_path: Path) -> None:
    report = week()
    paths = render.write(report, "md", tmp_path)
    document, pngs = paths[0], paths[1:]
    assert document == tmp_path / f"{STEM}.md"
    assert len(pngs) == 6
    text = document.read_text(encoding="utf-8")
    for png in pngs:
        assert png.parent == tmp_path and png.name.startswith(f"{STEM}-") and png.suffix == ".png"
        assert png.read_bytes().startswith(PNG)
        assert f"]({png.name})" in text
    assert str(tmp_path) not in text
    assert "Charts are not included" not in text
    # written again (a re-run for the same week): replaced, nothing left over
    render.write(report, "md", tmp_path)
    assert sorted(tmp_path.iterdir()) == sorted(paths)


@pytest.mark.usefixtures("drawn_once")
def test_writing_html_and_json_gives_one_file_each(tmp_path: Path) -> None:
    report = week()
    [page] = render.write(report, "html", tmp_path)
    assert page == tmp_path / f"{STEM}.html"
    assert page.read_text(encoding="utf-8").count('<img src="data:image/png;base64,') == 6
    [document] = render.write(report, "json", tmp_path)
    assert document == tmp_path / f"{STEM}.json"
    assert json.loads(document.read_text(encoding="utf-8")) == report
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{STEM}.html", f"{STEM}.json"]


def test_an_unknown_format_or_a_report_without_a_period_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        render.write(week(), "pdf", tmp_path)
    report = week()
    report["period"]["to"] = None
    with pytest.raises(ValueError, match="no valid 'to' time"):
        render.write(report, "md", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("no_matplotlib")
def test_without_matplotlib_the_report_says_its_charts_are_missing_and_still_renders(tmp_path: Path) -> None:
    assert charts.available() == "charts need matplotlib: pip install 'specguard[charts]'"
    with pytest.raises(RuntimeError, match="specguard\\[charts\\]"):
        charts.charts(week())
    paths = render.write(week(), "md", tmp_path) + render.write(week(), "html", tmp_path)
    assert [p.name for p in paths] == [f"{STEM}.md", f"{STEM}.html"]  # no PNG
    text, page = (p.read_text(encoding="utf-8") for p in paths)
    line = "Charts are not included: charts need matplotlib: pip install 'specguard[charts]'."
    assert text.count("Charts are not included") == 1
    assert "> **" + line.replace("[", "\\[").replace("]", "\\]") + "**" in text
    assert page.count("Charts are not included") == 1 and "<img" not in page
    assert line.replace("'", "&#x27;") in page
    assert "## qwen2.5-32b-instruct on 10.0.0.8:8000" in text and "## Silences" in text


def test_the_report_s_own_note_of_missing_charts_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    report = week()
    report["charts"] = {
        "available": False,
        "missing": "matplotlib was not installed where the report was made",
    }
    monkeypatch.setattr(charts, "available", lambda: charts.INSTALL)
    for shown in (render.markdown(report, {}), render.html(report, {})):
        assert shown.count("Charts are not included") == 1
        assert "Charts are not included: matplotlib was not installed where the report was made." in shown


def test_charts_leave_out_what_a_series_has_no_data_for(drawn: list[charts.Chart]) -> None:
    assert [chart.name for chart in drawn] == [
        "acceptance-week-llama-70b-10-0-0-7-8000",
        "per-position-llama-70b-10-0-0-7-8000",
        "latency-llama-70b-10-0-0-7-8000",
        "acceptance-week-qwen2-5-32b-instruct-10-0-0-8-8000",
        "per-position-qwen2-5-32b-instruct-10-0-0-8-8000",
        "latency-qwen2-5-32b-instruct-10-0-0-8-8000",
    ]
    assert all(chart.png.startswith(PNG) and len(chart.png) < 200_000 for chart in drawn)
    assert "ttft_p95" not in drawn[5].alt  # no baseline for it: not drawn against one
    report = week()
    quiet = report["series"][1]
    for row in quiet["latency"]:
        row["baseline"] = None
    for row in quiet["hourly"]:
        row["acceptance_rate"] = row["mean_acceptance_length"] = None
    quiet["per_position"] = []
    assert [chart.name for chart in charts.charts(report)] == [chart.name for chart in drawn[:3]]


def test_series_whose_names_reduce_to_the_same_file_name_keep_charts_of_their_own() -> None:
    report = week()
    twin = json.loads(json.dumps(report["series"][0]))
    twin["model"] = "llama 70b"  # "llama-70b" and "llama 70b" both read llama-70b
    report["series"].append(twin)
    assert charts.slugs(report) == [
        "llama-70b-10-0-0-7-8000",
        "qwen2-5-32b-instruct-10-0-0-8-8000",
        "llama-70b-10-0-0-7-8000-2",
    ]
