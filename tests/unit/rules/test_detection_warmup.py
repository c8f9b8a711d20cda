"""A detector's warm-up must hold one level of acceptance before it calibrates: windows fed through
the real evaluation (``evaluate_rule``: the detector and the engine, the clock passed in), several
servers at once, on the shipped ``acceptance_collapse`` rule where it matters (5 s windows, an hour
of warm-up) and on short warm-ups elsewhere.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import random
import re
import sqlite3
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.collapse_traffic import Traffic
from specguard.cli import main
from specguard.common.sequential import Dispersion
from specguard.config.loading import LoadedRule, load
from specguard.daemon.evaluation import evaluate_rule
from specguard.daemon.status import rule_rows
from specguard.daemon.statusview import detector_line as _detector_line
from specguard.engine import detection
from specguard.engine.detector_state import DetectorState
from specguard.engine.states import series_key
from specguard.engine.warmup import Held
from specguard.rules.schema import Rule
from specguard.rules.signals import Signal
from specguard.sources.base import Series, SourceResult
from specguard.store.baseline import parse_baseline
from specguard.store.database import Store
from specguard.store.records import SeriesState, State, Verdict

HEALTHY, COLLAPSED = 0.8, 0.05


def labels_of(server: str, model: str = "m") -> dict[str, str]:
    return {"instance": server, "model_name": model}


class Fleet:
    """A source answering token_acceptance for several servers: each one's next window (α̂, N)."""

    kind = "scrape"

    def __init__(self) -> None:
        self.next: dict[str, tuple[float, float]] = {}
        self.models: dict[str, str] = {}

    async def refresh(self) -> None:
        return None

    async def query_signal(self, signal: Signal, *_: Any) -> SourceResult:
        assert signal.name == "token_acceptance"
        return SourceResult(
            series=tuple(
                Series(labels_of(server, self.models.get(server, "m")), alpha, trials)
                for server, (alpha, trials) in self.next.items()
            )
        )

    async def query_expr(self, expr: str) -> SourceResult:
        raise AssertionError(expr)

    async def close(self) -> None:
        return None


def wobble(rng: random.Random, level: float, trials: float = 1000.0) -> tuple[float, float]:
    """A window at ``level``: its α̂ strays with the requests in flight (sd 0.02); a collapsed chain
    ends its drafts sooner, so it holds fewer trials."""
    n = trials if level > 0.3 else 0.45 * trials
    alpha = min(0.99, max(0.01, rng.gauss(level, 0.02)))
    return round(alpha * n) / n, n


class Run:
    """Evaluations of one rule on a simulated clock, one window a step, the states carried on."""

    def __init__(self, item: LoadedRule, baseline: Any = None) -> None:
        self.item, self.baseline = item, baseline
        self.source = Fleet()
        self.states: dict[str, SeriesState] = {}
        self.now = 1_800_000_000.0
        self.every = item.rule.interval or 5.0
        self.fired: list[tuple[str, float]] = []

    async def step(self, windows: dict[str, tuple[float, float]]) -> None:
        self.source.next = windows
        self.now += self.every
        outcome, _ = await evaluate_rule(
            self.item,
            self.source,  # type: ignore[arg-type]
            self.baseline,
            self.states,
            self.now,
            self.every,
        )
        self.states = outcome.states
        self.verdicts = outcome.verdicts
        self.fired += [(e.series, e.at) for e in outcome.events if e.kind is State.FIRING]

    def detector(self, server: str, model: str = "m") -> dict[str, Any]:
        rows = rule_rows([self.item], {self.item.name: self.states}, {}, interval=self.every)
        (row,) = [r for r in rows if r["labels"] == labels_of(server, model)]
        detector = row["detector"]
        assert isinstance(detector, dict)
        return detector


def shipped() -> LoadedRule:
    by_name = {item.name: item for item in load(None).enabled_rules()}
    return by_name["acceptance_collapse"]


def short(**detect: Any) -> LoadedRule:
    """A detector with a warm-up of ten 10 s windows."""
    fields = {
        "name": "collapse",
        "signal": "token_acceptance",
        "interval": "10s",
        "detect": {"in_control": "learn", "drop": 0.2, "warmup": "100s", **detect},
    }
    return LoadedRule(Rule.model_validate(fields), "rules.yaml", 1)


def said(caplog: pytest.LogCaptureFixture, words: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if words in r.getMessage()]


SERVERS = ("vllm-a:8000", "vllm-b:8000", "vllm-c:8000", "vllm-d:8000")
SHIFT = re.compile(
    r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \((\d+) checks?\): from \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC "
    r"for \w+ its windows had acceptance (0\.\d+) against the warm-up's median (0\.\d+), (\d+) of their "
    r"(\d+) under (0\.\d+) \(the median less (0\.12|0\.3)\): a shift by the CUSUM \([\d.]+ over h "
    r"[\d.]+\), so the warm-up goes on without the windows before them"
)


async def test_traffic_alternating_every_90s_between_healthy_and_collapsed_never_calibrates_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The shipped rule on four servers whose acceptance alternates every 90 s (18 windows)
    between 0.8 and 0.05, each server in its own phase, for an hour and a quarter: no warm-up
    holds one level, so none calibrates; each server says why in its status, and in the log once."""
    run = Run(shipped())
    rngs = {server: random.Random(index) for index, server in enumerate(SERVERS)}
    with caplog.at_level(logging.INFO, logger="specguard"):
        for w in range(900):
            await run.step(
                {
                    server: wobble(rngs[server], HEALTHY if ((w + 5 * i) // 18) % 2 == 0 else COLLAPSED)
                    for i, server in enumerate(SERVERS)
                }
            )
            assert set(run.verdicts.values()) == {Verdict.WARMING_UP}, w
    assert run.fired == []
    for server in SERVERS:
        d = run.detector(server)
        assert d["warming_up"] is True and d["homogeneous"] is False
        assert (d["phi"], d["in_control"], d["g"]) == (None, None, 0.0)  # nothing learned
        match = SHIFT.fullmatch(d["not_homogeneous"])
        assert match is not None, d["not_homogeneous"]
        checks, alpha, median = int(match[1]), float(match[2]), float(match[3])
        under, windows, level, drop = int(match[4]), int(match[5]), float(match[6]), float(match[7])
        assert checks > 50 and median == pytest.approx(HEALTHY, abs=0.03)
        # What it says is so: the stretch is below the median, the level is the median less the
        # drop, and about half its windows (the collapsed ones) are under it.
        assert alpha < median and level == pytest.approx(median - drop, abs=0.002)
        assert 0.3 < under / windows < 0.7
        assert _detector_line(d).endswith(
            f"warming up ({d['warmup']}); warm-up not homogeneous {d['not_homogeneous']}"
        )
    # Said once per server, when its first full warm-up was checked, not at every window after.
    unsettled = said(caplog, "does not calibrate: its warm-up is not homogeneous: from ")
    assert sorted(r.__dict__["labels"]["instance"] for r in unsettled) == sorted(SERVERS)
    assert all(r.levelname == "WARNING" for r in unsettled)
    assert said(caplog, "calibrates") == []


async def test_healthy_traffic_calibrates_when_its_hour_is_full_with_the_hours_phi_and_alpha0() -> None:
    """Simulated vLLM traffic (16 requests in flight, each its own acceptance, 30 s on average):
    the shipped rule warms up for 720 windows and calibrates on the last of them, with phi and
    alpha0 those of all 720 windows, as it did before the check, whatever the seed."""
    for seed in range(4):
        run = Run(shipped())
        counts = Traffic(np.random.default_rng(seed), 3, 16).windows(np.full(721, 0.75))
        trials = counts["accepted"] + counts["failures"]
        expected = Dispersion()
        for w in range(721):
            window = (float(counts["accepted"][w] / trials[w]), float(trials[w]))
            await run.step({"vllm-a:8000": window})
            d = run.detector("vllm-a:8000")
            if w < 719:
                expected.add(window[0] * window[1], window[1], follows=w > 0)
                assert d["warming_up"] is True and d["homogeneous"] is None, (seed, w)
            elif w == 719:
                expected.add(window[0] * window[1], window[1], follows=True)
                assert d["warming_up"] is False and d["homogeneous"] is True, (seed, d)
                assert d["phi"] == pytest.approx(expected.phi) and d["in_control"] == pytest.approx(
                    expected.alpha
                )
                assert d["not_homogeneous"] is None and d["in_control_from"] == "warm-up"
            else:
                assert run.verdicts[series_key(labels_of("vllm-a:8000"))] is Verdict.OK  # judged


async def test_a_collapse_in_the_warm_up_holds_calibration_back_until_it_has_slid_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Five minutes of collapse 25 minutes into the shipped rule's warm-up: the hour is not
    calibrated on; the warm-up slides on and calibrates on the first hour after the collapse
    (window 360 + 720), with the healthy level; then a collapse is caught at its first window."""
    run = Run(shipped())
    rng = random.Random(8)
    server = "vllm-a:8000"
    with caplog.at_level(logging.INFO, logger="specguard"):
        for w in range(1080):
            await run.step({server: wobble(rng, COLLAPSED if 300 <= w < 360 else HEALTHY)})
            d = run.detector(server)
            assert d["warming_up"] is (w < 1079), w
        assert d["homogeneous"] is True and d["not_homogeneous"] is None
        assert d["in_control"] == pytest.approx(HEALTHY, abs=0.005)
        assert d["phi"] < 10  # the wobble's; with the collapse in, it would be about 300
        for _ in range(30):  # healthy: nothing fires
            await run.step({server: wobble(rng, HEALTHY)})
        assert run.fired == []
        at = run.now + run.every
        await run.step({server: wobble(rng, COLLAPSED)})
    assert run.fired == [(series_key(labels_of(server)), at)]
    (unsettled,) = said(caplog, "does not calibrate: its warm-up is not homogeneous")
    assert "for 5m its windows had acceptance 0.0" in unsettled.getMessage()
    (settled,) = said(caplog, "calibrates: its warm-up holds one level now, after ")
    found = re.search(
        r"after (\d+) checks since .* that found a shift: acceptance ([\d.]+), phi", settled.getMessage()
    )
    assert settled.levelname == "INFO" and found is not None, settled.getMessage()
    assert int(found[1]) > 60 and float(found[2]) == pytest.approx(HEALTHY, abs=0.005)


async def test_learn_takes_the_baselines_token_acceptance_where_it_has_one() -> None:
    baseline = parse_baseline(
        {"version": 2, "measured_at": "2026-12-01T00:00:00Z",
         "entries": [{"model": "m", "signals": {"token_acceptance": 0.78}}]}
    )  # fmt: skip
    run = Run(short(), baseline)
    run.source.models = {"vllm-b:8000": "other"}  # no entry for its model, and no default entry
    rng = random.Random(2)
    for _ in range(11):
        await run.step({"vllm-a:8000": wobble(rng, 0.7), "vllm-b:8000": wobble(rng, 0.7)})
    measured = run.detector("vllm-a:8000")
    assert (measured["in_control"], measured["in_control_from"]) == (0.78, "baseline")
    assert measured["warmup_alpha"] == pytest.approx(0.7, abs=0.02)  # what the warm-up saw, beside it
    assert measured["shift_to"] == [pytest.approx(0.58)]
    learned = run.detector("vllm-b:8000", "other")
    assert learned["in_control_from"] == "warm-up"
    assert learned["in_control"] == learned["warmup_alpha"] == pytest.approx(0.7, abs=0.02)
    # The baseline's level during the warm-up, too, where the rule's view shows it.
    fresh = Run(short(), baseline)
    await fresh.step({"vllm-a:8000": wobble(rng, 0.7)})
    assert fresh.detector("vllm-a:8000")["in_control"] == 0.78
    assert "(the baseline's)" in _detector_line(measured)


async def test_a_baselines_level_does_not_spare_the_warm_up_its_check() -> None:
    # phi is still learned from the warm-up, and a collapse in it would inflate phi as much.
    baseline = parse_baseline(
        {"version": 1, "measured_at": "2026-12-01T00:00:00Z", "signals": {"token_acceptance": 0.8}}
    )
    run = Run(short(), baseline)
    rng = random.Random(3)
    for w in range(10):
        await run.step({"vllm-a:8000": wobble(rng, COLLAPSED if w in (4, 5) else HEALTHY)})
    d = run.detector("vllm-a:8000")
    assert d["warming_up"] is True and d["phi"] is None and d["not_homogeneous"] is not None


async def test_levels_not_below_the_warm_ups_median_leave_nothing_to_check_and_the_error_is_as_before() -> (
    None
):
    item = LoadedRule(
        Rule.model_validate(
            {"name": "collapse", "signal": "token_acceptance", "interval": "10s",
             "detect": {"in_control": "learn", "shift_to": 0.9, "warmup": "100s"}}
        ),
        "rules.yaml",
        1,
    )  # fmt: skip
    run = Run(item)
    rng = random.Random(9)
    for _ in range(11):
        await run.step({"vllm-a:8000": wobble(rng, 0.7)})
    key = series_key(labels_of("vllm-a:8000"))
    assert run.verdicts[key] is Verdict.ERROR
    assert run.states[key].error is not None and "is not above the ones to detect" in run.states[key].error
    d = run.detector("vllm-a:8000")
    assert d["warming_up"] is False and d["homogeneous"] is None  # calibrated, never checked


async def test_a_sliding_warm_up_survives_the_store_and_is_not_said_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(short())
    rng = random.Random(4)
    server, key = "vllm-a:8000", series_key(labels_of("vllm-a:8000"))
    with caplog.at_level(logging.INFO, logger="specguard"):
        for w in range(12):
            await run.step({server: wobble(rng, COLLAPSED if w in (3, 4) else HEALTHY)})
        before = run.states[key].detector
        assert before is not None and before["homogeneous"] is False
        assert len(Held.from_json(before["held"])) == 9  # the last ten but the oldest after each check
        store = Store(tmp_path / "specguard.db")
        await store.open()
        await store.commit_evaluation("collapse", run.states, [], None)
        await store.close()
        reopened = Store(tmp_path / "specguard.db")
        await reopened.open()
        loaded = (await reopened.load_states())["collapse"][key]
        await reopened.close()
        assert loaded.detector == before  # the windows' bytes as they were, in their own column
        with sqlite3.connect(tmp_path / "specguard.db") as db:
            text, packed = db.execute("SELECT detector, held FROM series_state").fetchone()
        assert packed == before["held"]["packed"] and "packed" not in json.loads(text)["held"]
        run.states = {key: loaded}  # a restarted daemon
        for _ in range(3):  # the collapse slides out with the third window
            await run.step({server: wobble(rng, HEALTHY)})
    d = run.detector(server)
    assert d["warming_up"] is False and d["homogeneous"] is True
    assert len(said(caplog, "does not calibrate")) == 1 and len(said(caplog, "calibrates:")) == 1
    assert run.states[key].detector is not None and len(Held.from_json(run.states[key].detector["held"])) == 0


async def test_a_warm_up_kept_as_sums_only_starts_again_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A state kept before the warm-up held its windows: the sums of the windows so far cannot be
    checked, so the warm-up starts again; a calibrated one goes on judging."""
    item = short()
    key = series_key(labels_of("vllm-a:8000"))
    sums = Dispersion()
    for _ in range(6):
        sums.add(800, 1000)
    calibration = {
        "interval": 10.0,
        "min_trials": 100,
        "warmup": 100.0,
        "learns_phi": True,
        "learns_alpha0": True,
    }
    old = {"calibration": calibration, "g": 0.0, "gs": [], "alpha0": None, "phi": None, "warmup": sums.to_json(),
           "windows": 0, "seen": 1_800_000_000.0}  # fmt: skip
    run = Run(item)
    run.states = {key: SeriesState(labels_of("vllm-a:8000"), State.INACTIVE, detector=old)}
    rng = random.Random(5)
    with caplog.at_level(logging.WARNING, logger="specguard"):
        await run.step({"vllm-a:8000": wobble(rng, HEALTHY)})
        await run.step({"vllm-a:8000": wobble(rng, HEALTHY)})
    assert run.detector("vllm-a:8000")["warmup"] == "2/10 windows"
    (restarted,) = said(caplog, "starts its warm-up again")
    assert restarted.getMessage() == (
        f"collapse: series {key} starts its warm-up again: the 6 windows of its warm-up so far were kept "
        "as sums only, which cannot be checked for a shift"
    )
    for _ in range(4):
        sums.add(800, 1000)
    calibrated = {**old, "warmup": sums.to_json(), "alpha0": 0.8, "phi": 2.0}
    run.states = {key: SeriesState(labels_of("vllm-a:8000"), State.INACTIVE, detector=calibrated)}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specguard"):
        await run.step({"vllm-a:8000": wobble(rng, HEALTHY)})
    assert run.verdicts[key] is Verdict.OK and caplog.records == []
    d = run.detector("vllm-a:8000")
    assert (d["in_control"], d["phi"], d["homogeneous"]) == (0.8, 2.0, None)  # never checked


def write_config(directory: Path, baseline: bool) -> Path:
    (directory / "rules.yaml").write_text(
        "rules:\n  - name: collapse\n    signal: token_acceptance\n    interval: 10s\n"
        "    detect: {in_control: learn, drop: 0.2, warmup: 100s}\n"
    )
    lines = ["state_dir: state", "rules: [rules.yaml]"]
    if baseline:
        (directory / "baseline.json").write_text(
            json.dumps({"version": 2, "measured_at": "2026-12-01T00:00:00Z",
                        "entries": [{"model": "m", "signals": {"token_acceptance": 0.78}}, {"signals": {}}]})
        )  # fmt: skip
        lines.append("baseline: baseline.json")
    config = directory / "specguard.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


async def test_check_shows_where_each_detector_takes_in_control_and_how_its_warm_ups_stand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without a baseline or a state database, a learning detector needs no word.
    config = write_config(tmp_path, baseline=False)
    assert main(["check", "--config", str(config)]) == 0
    assert capsys.readouterr().out == "OK: 1 rules in 1 file(s), 1 action(s)\n"

    config = write_config(tmp_path, baseline=True)
    run = Run(short())
    rng = random.Random(6)
    run.source.models = {"vllm-b:8000": "other"}
    for w in range(11):
        await run.step(
            {
                "vllm-a:8000": wobble(rng, COLLAPSED if w in (5, 6) else HEALTHY),
                "vllm-b:8000": wobble(rng, HEALTHY),
            }
        )
    store = Store(tmp_path / "state" / "specguard.db")
    await store.open()
    await store.commit_evaluation("collapse", run.states, [], None)
    await store.close()
    shift = run.detector("vllm-a:8000")["not_homogeneous"]
    assert main(["check", "--config", str(config)]) == 0  # how a warm-up stands is no config error
    out = capsys.readouterr().out.splitlines()
    assert out[-4:] == [
        "detectors:",
        "  collapse: in_control from the baseline's token_acceptance (model m: 0.78; default baseline: "
        "none, learned over the warm-up)",
        # The five windows before the collapse were let go when the warm-up was checked.
        f"  collapse instance=vllm-a:8000,model_name=m: warming up, 6/10 windows; not homogeneous {shift}",
        f"  collapse instance=vllm-b:8000,model_name=other: calibrated: in_control "
        f"{run.detector('vllm-b:8000', 'other')['in_control']:.3f} (warm-up), phi "
        f"{run.detector('vllm-b:8000', 'other')['phi']:.3g}",
    ]


def test_the_eval_line_names_a_warm_up_that_is_not_homogeneous() -> None:
    d: dict[str, Any] = {
        "g": 0.0, "h": 14.3, "phi": None, "in_control": None, "shift_to": [], "window_alpha": 0.05,
        "window_trials": 450.0, "warming_up": True, "warmup": "719/720 windows",
        "not_homogeneous": "since 2026-12-04 12:01:00 UTC (3 checks): its windows from ...",
    }  # fmt: skip
    assert _detector_line(d) == (
        "CUSUM G 0 of h 14.3; phi -; acceptance - -> -; last window 0.05 over 450 trials; warming up "
        "(719/720 windows); warm-up not homogeneous since 2026-12-04 12:01:00 UTC (3 checks): its "
        "windows from ..."
    )


def test_the_held_windows_are_stored_packed_and_read_back_as_written_or_as_an_older_specguard_wrote_them() -> (
    None
):
    held = Held()
    for i in range(720):  # an hour of 5 s windows
        held.add(1_000_000.0 + 5 * i, 100.0 + i % 7, 160.0)
    stored = held.to_json()
    # three little-endian doubles a window, whatever the machine
    assert set(stored) == {"origin", "packed"} and len(stored["packed"]) == 720 * 24
    assert struct.unpack_from("<3d", stored["packed"], 24 * 719) == (5.0 * 719, 100.0 + 719 % 7, 160.0)
    back = Held.from_json(stored)
    assert (back.origin, back.windows) == (held.origin, held.windows) and len(back) == 720
    assert back.time_of(719) == 1_000_000.0 + 5 * 719
    assert [w.follows for w in back.series(5.0)][:2] == [False, True]
    # as older versions wrote them into the state's JSON: base64 of the same bytes, or lists
    base64_json = json.loads(
        json.dumps({"origin": held.origin, "packed": base64.b64encode(held.packed).decode()})
    )
    assert Held.from_json(base64_json).windows == held.windows
    older = {"origin": 5.0, "windows": [[0.0, 3.0, 4.0], [5.0, 2.0, 4.0]]}
    assert Held.from_json(older).windows == [(0.0, 3.0, 4.0), (5.0, 2.0, 4.0)]
    back.drop(718)
    assert len(back) == 2 and back.time_of(0) == 1_000_000.0 + 5 * 718
    back.drop(2)
    assert (back.origin, len(back)) == (None, 0)
    # numbers that are not: told when the windows are decoded for the check
    assert (
        Held.from_json({"origin": 5.0, "packed": struct.pack("<3d", 0.0, math.nan, 4.0)}).series(5.0) is None
    )
    # anything malformed is let go whole, never half read
    for bad in ({"origin": 5.0, "packed": "not base64!"}, {"origin": 5.0, "packed": "AAAA"},
                {"origin": 5.0, "packed": b"\x00" * 23},
                {"origin": 5.0, "windows": [[0.0, 3.0]]}, {"origin": 5.0, "windows": [[0.0, "x", 4.0]]},
                {"origin": 5.0, "windows": [[0.0, float("nan"), 4.0]]}, None, []):  # fmt: skip
        assert (Held.from_json(bad).origin, len(Held.from_json(bad))) == (None, 0), bad


async def test_series_that_end_their_warm_ups_together_are_checked_a_batch_a_window_longest_waiting_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A central watch's series started together end their warm-ups in the same window: at most
    CHECKS_PER_EVALUATION are checked in it, the rest wait a window (still warming up, and shown
    waiting for their check) with their windows kept, those that waited longest going first."""
    monkeypatch.setattr(detection, "CHECKS_PER_EVALUATION", 3)
    run = Run(short())
    rng = random.Random(9)
    servers = [f"vllm-{i}:8000" for i in range(7)]
    late = servers[6]
    for w in range(10):  # ten windows each; the last server starts a window later
        await run.step({s: wobble(rng, HEALTHY) for s in servers if s != late or w > 0})
    warming = {s for s in servers if run.detector(s)["warming_up"]}
    assert len(warming) == 4 and late in warming  # three of the six due were checked
    shown = run.detector(sorted(warming - {late})[0])["warmup"]
    assert shown == "10/10 windows, waiting for its check"
    await run.step({s: wobble(rng, HEALTHY) for s in servers})
    # the three that waited (eleven windows) go before the late one (ten)
    assert {s for s in servers if run.detector(s)["warming_up"]} == {late}
    waited = detector_state(run, sorted(warming - {late})[0])
    assert waited.warmup.windows == 11 and waited.alpha0 is not None  # calibrated on all it held
    await run.step({s: wobble(rng, HEALTHY) for s in servers})
    assert not any(run.detector(s)["warming_up"] for s in servers)


def detector_state(run: Run, server: str) -> DetectorState:
    return DetectorState.from_json(run.states[series_key(labels_of(server))].detector)


async def test_a_warm_up_whose_windows_are_not_numbers_starts_again_when_checked_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = Run(short())
    rng = random.Random(5)
    server, key = "vllm-a:8000", series_key(labels_of("vllm-a:8000"))
    for _ in range(9):
        await run.step({server: wobble(rng, HEALTHY)})
    detector = dict(run.states[key].detector or {})
    packed = bytearray(detector["held"]["packed"])
    packed[8:16] = struct.pack("<d", math.nan)  # the first window's S
    detector["held"] = {**detector["held"], "packed": bytes(packed)}
    run.states[key] = replace(run.states[key], detector=detector)
    with caplog.at_level(logging.INFO, logger="specguard"):
        await run.step({server: wobble(rng, HEALTHY)})  # the tenth window: due, checked
    assert len(said(caplog, "were not read back as numbers")) == 1
    d = run.detector(server)
    assert d["warming_up"] is True and d["warmup"] == "1/10 windows"
