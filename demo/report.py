"""What the demo prints: its terminal lines (plain, with optional colour), and the report of its own
minutes, written from the history the daemon recorded and summed up on the terminal."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from specguard.report import weekly
from specguard.report.model import Report
from specguard.store.baseline import Baseline
from specguard.store.database import StoreError, opened

MODEL = "tiny-llama"
REPORTS = "reports"  # in the state directory, as the daemon's own reports
REPORT_FORMATS = ("html", "md")


class Terminal:
    """Plain lines with optional colour; readable when piped or on a dumb terminal."""

    CODES = {"dim": "2", "bold": "1", "red": "31", "yellow": "33", "green": "32", "cyan": "36"}

    def __init__(self, out: TextIO, color: bool):
        self.out = out
        self.color = color
        self.started = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.started

    def style(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(self.CODES[s] for s in styles)
        return f"\033[{codes}m{text}\033[0m"

    def line(self, text: str = "", *styles: str, stamp: bool = True) -> None:
        prefix = f"[{self.now():4.0f}s] " if stamp else ""
        self.out.write(prefix + self.style(text, *styles) + "\n")
        self.out.flush()

    def detail(self, text: str, *styles: str) -> None:
        self.out.write("        " + self.style(text, *styles) + "\n")
        self.out.flush()


async def write_report(
    store_path: Path,
    period: tuple[float, float],
    baseline: Baseline | None,
    out_dir: Path,
    remedies: Sequence[str] = (),
) -> tuple[Report, list[Path]]:
    """The report of ``period`` from the store at ``store_path``: HTML (one file) and Markdown
    (its charts beside it) in ``out_dir``; the report and the files written."""
    async with opened(store_path) as store:
        return await weekly.make(store, *period, REPORT_FORMATS, out_dir, baseline, remedies=remedies)


async def report_section(
    t: Terminal,
    store_path: Path,
    period: tuple[float, float],
    baseline: Baseline | None,
    instance: str,
    remedies: Sequence[str] = (),
) -> bool:
    """Write the report of the demo's minutes into the state directory and print its headline
    figures, then its files; False when it could not be written."""
    out_dir = store_path.parent / REPORTS
    t.line(stamp=False)
    t.line(f"report of the demo, {_clock(period[0])} to {_clock(period[1])} UTC, from the history "
           "specguard recorded at each scrape", "bold", stamp=False)  # fmt: skip
    try:
        report, paths = await write_report(store_path, period, baseline, out_dir, remedies)
    except (StoreError, OSError, ValueError) as exc:
        t.line(f"  the report could not be written into {out_dir}: {exc}", "red", stamp=False)
        return False
    for text, styles in report_lines(report, paths, instance, weekly.charts_missing()):
        t.line(text, *styles, stamp=False)
    return True


def report_lines(
    report: Report, paths: Sequence[Path], instance: str, charts_missing: str | None
) -> list[tuple[str, tuple[str, ...]]]:
    """The report's headline figures for the speculative server (``instance``), what the fallback
    and the rules did, and the files, last; each line with its styles."""
    lines: list[tuple[str, tuple[str, ...]]] = []
    series = next(
        (s for s in report.get("series") or [] if s.get("instance") == instance and s.get("model") == MODEL),
        None,
    )
    if series is None:
        lines.append((f"  server    {MODEL} on {instance}: no history was recorded for it", ("red",)))
    else:
        headline = series.get("headline") or {}
        figures = {name: (headline.get(name) or {}).get("value") for name in headline}
        drafts, minutes, k = figures.get("drafts") or 0, series.get("minutes") or 0, series.get("k")
        rate, length = figures.get("acceptance_rate"), figures.get("mean_acceptance_length")
        rate_text = "-" if rate is None else f"{rate * 100:.1f} %"
        length_text = "-" if length is None else f"{length:.2f}"
        lines.append(
            (f"  server    {MODEL} on {instance}, k = {k or '-'}: {drafts:,.0f} drafts in "
             f"{minutes} minute{'' if minutes == 1 else 's'} of history", ())
        )  # fmt: skip
        lines.append(
            (f"  accepted  {rate_text} of draft tokens, mean acceptance length {length_text} "
             "(healthy and collapsed together)", ())
        )  # fmt: skip
    fallbacks = report.get("fallbacks") or {}
    count, seconds = fallbacks.get("count") or 0, fallbacks.get("seconds") or 0.0
    lines.append((f"  fallback  {count} to standard decoding, {seconds:.1f} s in fallback", ()))
    fired = []
    for rule in report.get("rules") or []:
        text = f"{rule['rule']} fired {rule['fired']}, resolved {rule['resolved']}"
        if rule.get("median_time_to_act") is not None:
            text += f", acted {rule['median_time_to_act']:.1f} s after the breach began"
        fired.append(text)
    lines.append((f"  rules     {'; '.join(fired) or 'none fired'}", ()))
    if charts_missing is not None:
        lines.append((f"  charts    not included: {charts_missing}", ("yellow",)))
    pngs = sum(1 for path in paths if path.suffix == ".png")
    for path in paths:
        if path.suffix == ".html":
            lines.append((f"  html      {path}  (one self-contained file)", ("bold",)))
        elif path.suffix == ".md":
            beside = f"its {pngs} chart{'' if pngs == 1 else 's'} beside it" if pngs else "no charts"
            lines.append((f"  markdown  {path}  ({beside})", ("bold",)))
    return lines


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")
