"""What ``specguard eval`` reads, and saying so: a fresh reading over a short gap (two scrapes
``--sample-gap`` apart, 5 s by default), or with ``--window-from-rule`` over the rules' own window,
states from scratch. It is not the daemon's view, which holds each rule's whole window of samples
and its states: ``specguard status`` shows that. A rule whose window the reading did not cover
and that shows no data says so, since the daemon may well have a value for it.
"""

from __future__ import annotations

import argparse
import asyncio
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specguard.rules.durations import format_duration, format_wait

WIDTH = 100  # the paragraphs' width


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window-from-rule",
        action="store_true",
        help="sample for the rules' own window (the longest of those evaluated) instead of --sample-gap, "
        "scraping as often as the daemon does; takes as long as that window",
    )


@dataclass(frozen=True)
class Sampling:
    """How a scrape source is sampled before the rules are evaluated."""

    span: float  # seconds from the first scrape to the last
    every: float  # seconds between scrapes
    for_rule: str | None = None  # the rule whose window set the span (--window-from-rule)


def plan(loaded: Any, only: Iterable[str], gap: float, window_from_rule: bool) -> Sampling:
    """Two scrapes ``gap`` apart; or, for ``window_from_rule``, scrapes over the longest window of
    the rules evaluated (``only``, or every enabled rule), as often as the daemon scrapes."""
    from specguard.daemon.evaluation import window_of

    if not window_from_rule:
        return Sampling(gap, gap)
    wanted = set(only)
    windows = {
        item.name: window_of(item, loaded.config.interval)
        for item in loaded.enabled_rules()
        if not wanted or item.name in wanted
    }
    if not windows:
        return Sampling(gap, gap)
    name = max(windows, key=lambda n: windows[n])
    span = windows[name]
    return Sampling(span, max(1.0, min(loaded.config.interval, span / 4)), name)


async def sample(source: Any, sampling: Sampling) -> float | None:
    """Scrape as ``sampling`` says; the seconds the samples span (None: a Prometheus source, which
    keeps its own history and answers over each rule's window at once)."""
    if source.kind != "scrape":
        await source.refresh()
        return None
    first = time.monotonic()
    await source.refresh()
    # A sample is stamped when its scrape starts, and the rules read their window back from when
    # the last scrape has ended: over a rule's window, the last starts a little early (twice what
    # the first took) so that the first stays inside.
    margin = (
        0.0 if sampling.for_rule is None else min(sampling.span / 2, 2 * (time.monotonic() - first) + 0.1)
    )
    end = first + sampling.span - margin
    while end - time.monotonic() > sampling.every:
        await asyncio.sleep(sampling.every)
        await source.refresh()
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    last = time.monotonic()
    await source.refresh()
    return last - first


def announce(sampling: Sampling, kind: str, say: Callable[[str], None]) -> None:
    """Before a long sampling: how long, and when the answer comes."""
    if sampling.for_rule is None or kind != "scrape":
        return
    ready = time.strftime("%H:%M:%S", time.gmtime(time.time() + sampling.span))
    say(
        f"specguard eval: sampling for {format_duration(sampling.span)}, the window of {sampling.for_rule} "
        f"(a scrape every {format_wait(sampling.every)}); the reading comes at about {ready} UTC. Ctrl-C stops."
    )


def what_it_is(sampling: Sampling, kind: str, sampled: float | None) -> str:
    """The paragraph at the head of eval's output, wrapped."""
    scratch = "states from scratch (a breach with `for:` shows as pending)"
    daemon = "What the running daemon sees over each rule's window, with its states: `specguard status`."
    if kind != "scrape":
        text = f"A fresh reading, not the daemon's: Prometheus asked now over each rule's window, {scratch}. {daemon}"
    elif sampling.for_rule is None:
        took = format_wait(sampled if sampled is not None else sampling.span)
        text = (
            f"A fresh reading, not the daemon's: two scrapes {took} apart, each rule's signal over those {took} "
            f"only, {scratch}. {daemon} To sample for the rules' own window here: --window-from-rule."
        )
    else:
        took = format_wait(sampled if sampled is not None else sampling.span)
        text = (
            f"A fresh reading, not the daemon's: scrapes over {took} (the window of {sampling.for_rule}), each "
            f"rule's signal over its own window as far as that covers it, {scratch}. {daemon}"
        )
    return textwrap.fill(text, WIDTH, break_on_hyphens=False)


def over(window: float | None, sampled: float | None) -> tuple[float | None, str]:
    """What a rule's value is over: seconds, and as the table shows it (``5s of 5m``); an alert
    rule's is no window (None, ``-``)."""
    if window is None:
        return None, "-"
    if sampled is None or sampled >= window:
        return window, format_duration(window)
    return sampled, f"{format_wait(sampled)} of {format_duration(window)}"


def note(row: dict[str, Any], window: float | None, sampled: float | None, scraped: bool) -> str | None:
    """Why a rule without data here may well have a value in the daemon: the reading was shorter
    than its window (``scraped``: every target answered, so the short reading is the reason)."""
    if row["verdict"] != "no_data" or not scraped or window is None or sampled is None or sampled >= window:
        return None
    return f"no data in the {format_wait(sampled)} sampled; the daemon reads {format_duration(window)}"


def notes_line(rows: Sequence[dict[str, Any]]) -> str | None:
    """The rows' notes as one paragraph under the table."""
    short = [row for row in rows if row.get("note")]
    if not short:
        return None
    rules = ", ".join(dict.fromkeys(f"{row['rule']} ({format_duration(row['window'])})" for row in short))
    text = (
        f"No data in the {format_wait(short[0]['over'])} sampled for {rules}: the daemon reads each rule's "
        "whole window (in brackets). `specguard status` shows its values; --window-from-rule samples that long."
    )
    return textwrap.fill(text, WIDTH, break_on_hyphens=False)
