"""Items 4-6 over hours of history (store/history.py's hour rows and minutes), written from a
simulated timeline whose truth is kept aside (tests/week.py): the acceptance is the timeline's own,
a preemption burst is found inside an hour whose total alone would not tell it, a server the config
no longer names is left out, and the estimate of item 5 is MAL / (1 + k c) from the truth."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from specguard.config.loading import load
from specguard.preflight.item import Context, Status
from specguard.preflight.items import acceptance, kv_cache, speedup
from specguard.store.connection import open_database
from specguard.store.exposition import parse_exposition
from specguard.store.history import record
from tests.week import Conditions, Server, Timeline

START = 1_796_000_400.0  # a whole hour
HOURS = 3
BURST_MINUTE = START + 3600 + 17 * 60


def calm(at: float) -> Conditions:
    return Conditions(alpha=0.8, load=1.0, kv=0.6, preemptions=5)  # 300 an hour, never 10 in a minute


def bursty(at: float) -> Conditions:
    return Conditions(alpha=0.3, load=1.0, kv=0.97 if at == BURST_MINUTE else 0.6,
                      preemptions=40 if at == BURST_MINUTE else 0)  # fmt: skip


def history(tmp: Path, *servers: tuple[str, Callable[[float], Conditions]]) -> tuple[Path, list[Server]]:
    made = [Server(instance, "llama", 3, conditions) for instance, conditions in servers]
    timeline = Timeline(made)
    db = open_database(tmp / "state" / "specguard.db")
    minute = START
    while minute < START + HOURS * 3600:
        scrapes = []
        for server in made:
            timeline.advance(server, minute)
            scrapes.append((server.instance, minute + 30, parse_exposition(timeline.exposition(server))))
        record(db, scrapes)
        minute += 60
    db.close()
    return tmp / "state" / "specguard.db", made


def context(
    tmp: Path, instances: list[str], store: Path, baseline: dict[str, object] | None = None
) -> Context:
    config = {"state_dir": str(tmp / "state"), "rules": [],
              "sources": {"scrape": {"targets": [f"http://{i}/metrics" for i in instances]}}}  # fmt: skip
    if baseline is not None:
        (tmp / "baseline.json").write_text(json.dumps(baseline))
        config["baseline"] = str(tmp / "baseline.json")
    (tmp / "specguard.yaml").write_text(json.dumps(config))
    loaded = load(tmp / "specguard.yaml")
    assert loaded.ok, loaded.errors
    ctx = Context(
        loaded=loaded, config_file=tmp / "specguard.yaml", store_file=store, now=START + HOURS * 3600
    )
    ctx.cache["servers"] = []  # no server answers here: items 4-6 read history only
    return ctx


async def test_acceptance_is_the_timelines_and_a_server_no_longer_named_is_left_out(tmp_path: Path) -> None:
    store, (a, _) = history(tmp_path, ("10.0.0.7:8000", calm), ("10.0.0.8:8000", bursty))
    answer = await acceptance.check(context(tmp_path, ["10.0.0.7:8000"], store))
    truth = a.truth[1:]  # the first scrape is the reference: nothing counted before it
    rate = sum(m.accepted for m in truth) / sum(m.draft_tokens for m in truth)
    assert answer.status is Status.PASS
    (line,) = answer.evidence
    assert line.startswith(f"10.0.0.7:8000 llama: acceptance {rate:.3f} over 0.55 ")
    assert f"{sum(m.drafts for m in truth):,} drafts, {HOURS * 60} min of history in the last 7d" in line

    answer = await acceptance.check(context(tmp_path, ["10.0.0.7:8000", "10.0.0.8:8000"], store))
    assert answer.status is Status.FAIL and "10.0.0.8:8000 llama: acceptance" in answer.evidence[1]


async def test_a_burst_inside_an_hour_is_found_minute_by_minute(tmp_path: Path) -> None:
    store, _ = history(tmp_path, ("10.0.0.7:8000", calm), ("10.0.0.8:8000", bursty))
    answer = await kv_cache.check(context(tmp_path, ["10.0.0.7:8000"], store))
    assert answer.status is Status.PASS, answer
    assert answer.evidence[1] == f"  {5 * (HOURS * 60 - 1):,} preemptions, no minute over 10"

    answer = await kv_cache.check(context(tmp_path, ["10.0.0.8:8000"], store))
    assert answer.status is Status.FAIL
    assert (
        "KV-cache usage at peak 97.0% (in the hour from 2026-11-30 02:00 UTC), NOT under 95%"
        in answer.evidence[0]
    )
    assert (
        answer.evidence[1]
        == "  40 preemptions; 1 minute(s) over 10 (a burst), the worst 40 at 2026-11-30 02:17 UTC"
    )


async def test_the_speedup_estimate_is_mal_over_one_plus_k_c(tmp_path: Path) -> None:
    store, (a,) = history(tmp_path, ("10.0.0.7:8000", calm))
    baseline = {"version": 2, "measured_at": "2026-11-29T08:00:00Z",
                "entries": [{"model": "llama", "speculative": {"draft_cost": 0.1}}]}  # fmt: skip
    answer = await speedup.check(context(tmp_path, ["10.0.0.7:8000"], store, baseline))
    truth = a.truth[1:]
    mal = 1 + sum(m.accepted for m in truth) / sum(m.drafts for m in truth)
    assert answer.status is Status.PASS
    assert answer.evidence[0].startswith(
        f"10.0.0.7:8000 llama: {mal / 1.3:.2f}x over 1.3x, estimated MAL / (1 + k c) = {mal:.2f} / (1 + 3 x 0.1)"
    )
    assert mal / 1.3 == pytest.approx((1 + 0.8 + 0.64 + 0.512) / 1.3, rel=0.03)
