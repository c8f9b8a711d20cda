"""The weekly report as people read it: Markdown (with its charts as PNG files beside it) or one
self-contained HTML file (charts inlined), from the report's JSON document (report/model.py).

Both renderings are made from one outline of the report, so they hold the same sections in the
same order. Labels, rule names and reasoning come from vLLM's metrics and from configuration, not
from specguard, so every piece of text is escaped for the format it lands in: a model named
``<script>`` must show as text in a browser and in a Markdown viewer alike. The HTML file loads
nothing and runs nothing (its Content-Security-Policy forbids both), so it can be mailed, attached
to a ticket or opened from a shared drive safely.

Here: the two renderings and the files they are written to. The outline is made in
``sections`` (``series_section`` for each series) of the blocks in ``document``, its values
written by ``values``; ``to_markdown`` and ``to_html`` write its blocks.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from specguard.common.files import write_atomically
from specguard.report import charts, sections, to_html, to_markdown, values
from specguard.report.model import Report

FORMATS: tuple[str, ...] = ("md", "html", "json")


def markdown(report: Report, images: Mapping[str, str], alts: Mapping[str, str] | None = None) -> str:
    """The report in Markdown. ``images`` maps a chart's name (see report/charts.py) to the file,
    relative to the Markdown file, that holds its PNG; ``alts`` optionally gives each chart a
    description of what it shows (else its title)."""
    outline = sections.outline_of(report, set(images))
    lines = [f"# {to_markdown.escape(outline.title)}", ""]
    for block in outline.blocks:
        lines.extend(to_markdown.block_lines(block, images, alts or {}))
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def html(report: Report, images: Mapping[str, bytes], alts: Mapping[str, str] | None = None) -> str:
    """The report as one HTML file: ``images`` maps a chart's name to its PNG, inlined as a data:
    URI; the style is inline; nothing is loaded from elsewhere and there is no script."""
    outline = sections.outline_of(report, set(images))
    body = "\n".join(to_html.block_element(block, images, alts or {}) for block in outline.blocks)
    return to_html.document(outline.title, body)


def write(report: Report, fmt: str, out_dir: Path, drawn: list[charts.Chart] | None = None) -> list[Path]:
    """Write the report as ``out_dir/report-<from>-<to>.<fmt>`` (``md``, ``html`` or ``json``) and
    return the paths written, the report first. Markdown gets its charts beside it as
    ``report-<from>-<to>-<chart>.png``, written before the Markdown so that a reader of the new
    file finds its images. Every file is replaced atomically: a reader sees the old report or the
    new one. ``drawn``: the charts, when the caller drew them already (several formats, one
    drawing). Raises ValueError for an unknown format or a report without a period, OSError."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")
    stem = filename_stem(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.{fmt}"
    if fmt == "json":
        write_atomically(path, json.dumps(report, indent=2) + "\n", keep_previous=False)
        return [path]
    if drawn is None:
        drawn = charts.charts(report) if charts.available() is None else []
    alts = {chart.name: chart.alt for chart in drawn}
    if fmt == "html":
        write_atomically(path, html(report, {c.name: c.png for c in drawn}, alts), keep_previous=False)
        return [path]
    pngs = write_charts(report, drawn, out_dir)
    names = {chart.name: png.name for chart, png in zip(drawn, pngs, strict=True)}
    write_atomically(path, markdown(report, names, alts), keep_previous=False)
    return [path, *pngs]


def write_charts(report: Report, drawn: list[charts.Chart], out_dir: Path) -> list[Path]:
    """Each chart as ``report-<from>-<to>-<chart>.png`` in ``out_dir``, atomically."""
    stem = filename_stem(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs: list[Path] = []
    for chart in drawn:
        png = out_dir / f"{stem}-{chart.name}.png"
        _write_bytes_atomically(png, chart.png)
        pngs.append(png)
    return pngs


def filename_stem(report: Report) -> str:
    """``report-<from>-<to>``, the UTC dates (YYYY-MM-DD) of the report's period, with the time
    (THHMM) when a bound is not a midnight: two reports of one day do not overwrite each other."""
    period = report.get("period") or {}
    times = []
    for end in ("from", "to"):
        at = values.time(period.get(end))
        if at is None:
            raise ValueError(f"the report's period has no valid {end!r} time: {period.get(end)!r}")
        times.append(at)
    midnights = all((t.hour, t.minute, t.second) == (0, 0, 0) for t in times)
    shown = [t.strftime("%Y-%m-%d" if midnights else "%Y-%m-%dT%H%M") for t in times]
    return f"report-{shown[0]}-{shown[1]}"


def _write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a part.

    common.files.write_atomically writes text; a PNG is bytes. The temporary file is created with
    mode 0666 so the umask, not a fixed 0600, decides who may read the image, as for the report.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
