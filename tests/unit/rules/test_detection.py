"""Rules with `detect:`: the CUSUM on token_acceptance through the real evaluation and engine, one
window per evaluation, fed by a source that answers windows generated from the chain model."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specguard.common.sequential import Dispersion, kl, threshold
from specguard.config.loading import LoadedRule, load
from specguard.daemon.evaluation import evaluate_rule
from specguard.daemon.status import rule_rows
from specguard.rules.schema import Rule
from specguard.rules.signals import Signal
from specguard.sources.base import Series, SourceResult
from specguard.store.baseline import parse_baseline
from specguard.store.database import Store
from specguard.store.records import SeriesState, State, Verdict

LABELS = {"instance": "vllm-a:8000", "model_name": "m"}
KEY = '{"instance":"vllm-a:8000","model_name":"m"}'
INTERVAL = 10.0


class Windows:
    """A source answering token_acceptance for one series: the next window's (α̂, trials)."""

    kind = "scrape"

    def __init__(self) -> None:
        self.next: tuple[float, float] | None = None
        self.rng = random.Random(1)
        self.window = INTERVAL  # the rule's interval: what every query must ask for

    def draw(self, alpha: float, trials: int = 1000) -> None:
        successes = sum(self.rng.random() < alpha for _ in range(trials))
        self.next = (successes / trials, float(trials))

    async def refresh(self) -> None:
        return None

    async def query_signal(
        self, signal: Signal, window: float, group_by: Sequence[str], *_: Any
    ) -> SourceResult:
        assert signal.name == "token_acceptance" and window == self.window  # one interval per window
        if self.next is None:
            return SourceResult()
        value, trials = self.next
        return SourceResult(series=(Series(dict(LABELS), value, trials),))

    async def query_expr(self, expr: str) -> SourceResult:
        raise AssertionError(expr)

    async def close(self) -> None:
        return None


def detector_rule(interval: str = "10s", **detect: Any) -> LoadedRule:
    detect.setdefault("in_control", 0.75)
    detect.setdefault("shift_to", 0.45)
    detect.setdefault("false_alarm_every", "30d")
    detect.setdefault("warmup", "100s")  # ten windows
    detect.setdefault("single_window", False)  # the CUSUM alone; the window test has tests of its own
    fields = {"name": "collapse", "signal": "token_acceptance", "interval": interval, "detect": detect}
    return LoadedRule(Rule.model_validate(fields), "rules.yaml", 1)


class Run:
    """Evaluations of one rule on a simulated clock, the states carried from one to the next."""

    def __init__(self, item: LoadedRule, baseline: Any = None) -> None:
        self.item, self.baseline = item, baseline
        self.source = Windows()
        self.states: dict[str, SeriesState] = {}
        self.now = 1_000_000.0
        self.events: list[tuple[float, State]] = []

    async def window(self, alpha: float | None, trials: int = 1000, exact: bool = False) -> SeriesState:
        """The next window: drawn at ``alpha``, or (``exact``) with α̂ exactly ``alpha``."""
        if alpha is None:
            self.source.next = None
        elif exact:
            self.source.next = (alpha, float(trials))
        else:
            self.source.draw(alpha, trials)
        every = self.item.rule.interval or INTERVAL
        self.source.window = every
        self.now += every
        outcome, _ = await evaluate_rule(self.item, self.source, self.baseline, self.states, self.now, every)  # type: ignore[arg-type]
        self.states = outcome.states
        self.events += [(e.at, e.kind) for e in outcome.events]
        self.verdict = outcome.verdicts.get(KEY)
        return self.states[KEY]


H = threshold(30 * 86400 / INTERVAL)


async def test_it_warms_up_then_fires_on_a_drop_and_resolves_with_g_reset() -> None:
    run = Run(detector_rule())
    for _ in range(10):
        state = await run.window(0.75)
        assert run.verdict is Verdict.WARMING_UP and state.state is State.INACTIVE
    assert state.detector is not None and state.detector["phi"] is not None
    assert state.detector["phi"] >= 1.0
    for _ in range(30):  # in control: G stays small, nothing fires
        state = await run.window(0.75)
        assert run.verdict is Verdict.OK and state.value is not None and state.value < H
    assert run.events == []
    fired_at = None
    for _ in range(5):  # 1,000 trials a window at 0.45: one or two windows are enough
        state = await run.window(0.45)
        if state.state is State.FIRING:
            fired_at = run.now
            break
    assert fired_at is not None and [kind for _, kind in run.events] == [State.PENDING, State.FIRING]
    assert state.value is not None and H <= state.value <= 2 * H  # held at 2h at most
    assert state.threshold == pytest.approx(H)
    for _ in range(20):
        state = await run.window(0.75)
        if state.state is State.RESOLVED:
            break
    assert state.state is State.RESOLVED
    assert state.detector is not None and state.detector["g"] == 0.0  # starts again from nothing


async def test_a_window_with_too_few_trials_is_no_data_and_leaves_g_alone() -> None:
    run = Run(detector_rule(warmup="20s"))
    await run.window(0.75)
    await run.window(0.75)
    state = await run.window(0.45)
    g = state.detector["g"] if state.detector else None
    assert g is not None and g > 0
    state = await run.window(0.10, trials=20)  # 20 trials, below min_trials (100)
    assert run.verdict is Verdict.NO_DATA
    assert state.detector is not None and state.detector["g"] == g
    state = await run.window(None)  # nothing at all
    assert run.verdict is Verdict.NO_DATA and state.detector is not None and state.detector["g"] == g


async def test_in_control_is_learned_over_the_warm_up() -> None:
    run = Run(detector_rule(in_control="learn", shift_to=None, drop=0.2))
    for _ in range(10):
        state = await run.window(0.62)
    assert state.detector is not None
    assert state.detector["alpha0"] == pytest.approx(0.62, abs=0.02)
    state = await run.window(0.62)
    assert run.verdict is Verdict.OK
    (row,) = rule_rows([run.item], {"collapse": run.states}, {}, interval=INTERVAL)
    shown = row["detector"]
    assert shown["h"] == pytest.approx(H) and shown["warming_up"] is False
    assert shown["in_control"] == pytest.approx(0.62, abs=0.02)
    assert shown["shift_to"] == [pytest.approx(shown["in_control"] - 0.2)]
    assert shown["warmup"] == "10/10 windows" and shown["phi"] >= 1


async def test_in_control_from_the_baseline_and_a_model_without_it_is_an_error() -> None:
    baseline = parse_baseline(
        {"version": 2, "measured_at": "2026-12-01T00:00:00Z",
         "entries": [{"model": "m", "signals": {"token_acceptance": 0.8}}, {"signals": {}}]}
    )  # fmt: skip
    run = Run(detector_rule(in_control="baseline", phi=1.0, shift_to=0.5), baseline)
    state = await run.window(0.8)  # φ given and α0 known: no warm-up
    assert run.verdict is Verdict.OK and state.value == 0.0
    other = parse_baseline(
        {"version": 2, "measured_at": "2026-12-01T00:00:00Z",
         "entries": [{"model": "x", "signals": {"token_acceptance": 0.8}}]}
    )  # fmt: skip
    failing = Run(detector_rule(in_control="baseline", phi=1.0, shift_to=0.5), other)
    state = await failing.window(0.8)
    assert failing.verdict is Verdict.ERROR
    assert state.error is not None and state.error.startswith("in_control: baseline: ")


async def test_the_detector_state_survives_the_store(tmp_path: Path) -> None:
    run = Run(detector_rule(warmup="20s", shift_to=0.65))
    for alpha in (0.75, 0.75, 0.6):
        await run.window(alpha)
    store = Store(tmp_path / "specguard.db")
    await store.open()
    await store.commit_evaluation("collapse", run.states, [], None)
    await store.close()
    reopened = Store(tmp_path / "specguard.db")
    await reopened.open()
    loaded = (await reopened.load_states())["collapse"][KEY]
    await reopened.close()
    assert loaded.detector == run.states[KEY].detector
    run.states = {KEY: loaded}
    before = loaded.detector["g"] if loaded.detector else 0.0
    state = await run.window(0.6)  # the evidence carries on from where it was
    assert state.detector is not None and state.detector["g"] > before


def write(directory: Path, rules: str) -> Path:
    (directory / "rules.yaml").write_text(rules)
    config = directory / "specguard.yaml"
    config.write_text("rules: [rules.yaml]\n")
    return config


@pytest.mark.parametrize(
    ("body", "where", "message"),
    [
        (
            "    signal: acceptance_rate\n    detect: {shift_to: 0.4}\n",
            "rules[0]",
            "give `signal: token_acceptance`",
        ),
        (
            "    signal: token_acceptance\n    condition: '< 0.5'\n    detect: {shift_to: 0.4}\n",
            "rules[0]",
            "not both",
        ),
        (
            "    signal: token_acceptance\n    window: 60s\n    detect: {shift_to: 0.4}\n",
            "rules[0]",
            "leave `window` out",
        ),
        (
            "    signal: token_acceptance\n    detect: {in_control: 0.5, shift_to: 0.6}\n",
            "rules[0].detect",
            "must lie below in_control",
        ),
        (
            "    signal: token_acceptance\n    detect: {in_control: 0.7}\n",
            "rules[0].detect",
            "give one of `shift_to`",
        ),
        (
            "    signal: token_acceptance\n    detect: {shift_to: 1.5}\n",
            "rules[0].detect",
            "shift_to is a per-token acceptance in (0, 1)",
        ),
        (
            "    signal: token_acceptance\n    detect: {shift_to: 0.4, method: ewma}\n",
            "rules[0].detect.method",
            "cusum",
        ),
        (
            "    signal: token_acceptance\n    detect: {shift_to: 0.4, phi: 0.5}\n",
            "rules[0].detect.phi",
            "greater than or equal to 1",
        ),
    ],
)
def test_a_bad_detector_is_named_by_file_line_and_field(
    tmp_path: Path, body: str, where: str, message: str
) -> None:
    config = write(tmp_path, "rules:\n  - name: collapse\n" + body)
    loaded = load(config)
    assert not loaded.ok
    text = "\n".join(str(p) for p in loaded.problems)
    assert (
        f"rules.yaml:2: {where}" in text
        or f"rules.yaml:3: {where}" in text
        or f"rules.yaml:4: {where}" in text
    ), text
    assert message in text, text


def test_h_follows_the_interval_and_the_false_alarm_target() -> None:
    item = detector_rule(false_alarm_every="7d")
    from specguard.daemon.evaluation import spec_of

    spec = spec_of(item, 15.0)
    assert spec.condition.constant == pytest.approx(math.log(7 * 86400 / 10))
    assert spec.forget_after >= 7 * 86400  # the calibration outlives a quiet spell


async def test_several_levels_run_a_cusum_each_against_h_plus_ln_n() -> None:
    # A collapse fires sooner on the deep level's statistic; the threshold pays ln 2 for two.
    run = Run(detector_rule(shift_to=[0.65, 0.45], phi=1.0))
    state = await run.window(0.75)
    assert state.threshold == pytest.approx(H + math.log(2))
    assert state.detector is not None and len(state.detector["gs"]) == 2
    state = await run.window(0.5, trials=150)
    shallow, deep = state.detector["gs"] if state.detector else (0.0, 0.0)
    assert deep > shallow > 0 and state.value == deep
    assert state.state is State.FIRING  # 150 trials at 0.5 with phi 1: about 21 on the deep level
    state = await run.window(0.75)  # 1,000 trials back at 0.75 take both far below h
    assert state.state is State.RESOLVED
    assert state.detector is not None and state.detector["gs"] == [0.0, 0.0]


async def test_a_gap_in_the_warm_up_does_not_pair_windows_that_were_not_neighbours() -> None:
    run = Run(detector_rule())  # ten windows of warm-up
    for _ in range(4):
        await run.window(0.75)
    await run.window(None)  # a window without data between them
    for _ in range(6):
        state = await run.window(0.75)
    assert state.detector is not None
    warmup = state.detector["warmup"]
    assert warmup["windows"] == 10
    assert warmup["cross"]["1"][0] == 3 + 5  # pairs within each run of neighbours, none across


LEARNING = {"in_control": "learn", "shift_to": None, "drop": 0.2}


async def calibrated(run: Run) -> dict[str, Any]:
    """Ten windows of warm-up at 0.75 with 10 s windows, then one at 0.62: G above 0, below h."""
    for _ in range(10):
        await run.window(0.75)
    state = await run.window(0.62, trials=200, exact=True)
    assert run.verdict is Verdict.OK and state.detector is not None
    assert state.detector["g"] > 0 and state.detector["phi"] is not None
    assert state.detector["calibration"] == {
        "interval": 10.0, "min_trials": 100, "warmup": 100.0, "learns_phi": True, "learns_alpha0": True
    }  # fmt: skip
    return dict(state.detector)


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        ({"interval": "5s"}, "the interval changed from 10s to 5s"),
        ({"warmup": "200s"}, "the warm-up changed from 1m40s to 3m20s"),
        ({"min_trials": 500}, "min_trials changed from 100 to 500"),
    ],
)
async def test_a_calibration_from_other_windows_is_not_reused_the_series_warms_up_again_said_once(
    changed: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(detector_rule(**LEARNING))
    await calibrated(run)
    run.item = detector_rule(**{**LEARNING, **changed})  # the config the daemon is reloaded with
    with caplog.at_level("WARNING", logger="specguard"):
        for _ in range(3):
            state = await run.window(0.75)
            assert run.verdict is Verdict.WARMING_UP
    assert state.detector is not None
    assert (state.detector["g"], state.detector["phi"], state.detector["alpha0"]) == (0.0, None, None)
    assert state.detector["warmup"]["windows"] == 3  # counted again from the change
    said = [r.getMessage() for r in caplog.records if "warms up again" in r.getMessage()]
    assert said == [
        f"collapse: series {KEY} warms up again: {reason}, so its phi and in_control were "
        "measured on other windows"
    ]
    assert caplog.records[0].__dict__["labels"] == LABELS


async def test_in_control_learned_where_it_was_given_warms_up_again_but_given_where_learned_does_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    given = Run(detector_rule())  # in_control 0.75: the warm-up estimates phi only
    for _ in range(11):
        await given.window(0.75)
    given.item = detector_rule(**LEARNING)
    with caplog.at_level("WARNING", logger="specguard"):
        await given.window(0.75)
    assert given.verdict is Verdict.WARMING_UP
    assert "in_control is now learned, not given" in caplog.text
    caplog.clear()
    # The other way, phi still holds: it measured the windows' spread around their own mean.
    learned = Run(detector_rule(**LEARNING))
    before = await calibrated(learned)
    learned.item = detector_rule(in_control=0.75, shift_to=None, drop=0.2)
    with caplog.at_level("WARNING", logger="specguard"):
        state = await learned.window(0.62, trials=200, exact=True)
    assert learned.verdict is Verdict.OK and caplog.text == ""
    assert state.detector is not None and state.detector["phi"] == before["phi"]
    assert state.detector["g"] > before["g"]


async def test_a_state_kept_before_its_calibration_was_is_taken_as_the_rules(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = Run(detector_rule(**LEARNING))
    before = await calibrated(run)
    state = run.states[KEY]
    assert state.detector is not None
    run.states = {
        KEY: replace(state, detector={k: v for k, v in state.detector.items() if k != "calibration"})
    }
    with caplog.at_level("WARNING", logger="specguard"):
        state = await run.window(0.62, trials=200, exact=True)
    assert run.verdict is Verdict.OK and caplog.text == ""
    assert state.detector is not None and state.detector["g"] > before["g"]
    assert state.detector["calibration"] == before["calibration"]


async def test_with_phi_and_in_control_given_a_new_interval_changes_nothing_learned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = Run(detector_rule(phi=2.0, shift_to=0.6))
    await run.window(0.65, trials=200, exact=True)
    g = run.states[KEY].detector["g"] if run.states[KEY].detector else 0.0
    assert g > 0  # no warm-up: judged from the first window
    run.item = detector_rule("5s", phi=2.0, shift_to=0.6)
    with caplog.at_level("WARNING", logger="specguard"):
        state = await run.window(0.65, trials=200, exact=True)
    assert run.verdict is Verdict.OK and caplog.text == ""
    assert state.detector is not None and state.detector["g"] > g


# --- the window test (single_window) --------------------------------------------------------------


async def test_a_collapse_in_one_window_fires_there_where_the_cusum_alone_needs_more() -> None:
    """Warm-up windows that drift slowly (a few long requests): their long-run dispersion, which
    the CUSUM divides by, is several times the windows' own. A window at 0.45 with just enough
    trials for its own evidence to pass h fires at once; the CUSUM alone takes more windows."""
    fired: dict[bool, int] = {}
    for single in (True, False):
        run = Run(detector_rule(shift_to=0.45, single_window=single))
        for alpha in [0.73] * 5 + [0.77] * 5:  # the warm-up: ten 10 s windows
            state = await run.window(alpha, trials=1000, exact=True)
        assert state.detector is not None
        warm = Dispersion.from_json(state.detector["warmup"])
        assert warm.window_phi is not None and warm.phi is not None
        assert warm.phi > 1.5 * warm.window_phi  # the windows are correlated
        h = threshold(30 * 86400 / INTERVAL) + math.log(2 if single else 1)
        trials = math.ceil(1.01 * h * warm.window_phi / kl(0.45, 0.75))
        windows = 0
        while run.events == [] and windows < 20:
            state = await run.window(0.45, trials=trials, exact=True)
            windows += 1
        fired[single] = windows
        assert [kind for _, kind in run.events] == [State.PENDING, State.FIRING]
        assert state.threshold == pytest.approx(h)
        if single:
            assert state.detector["evidence"] == pytest.approx(trials / warm.window_phi * kl(0.45, 0.75))
            assert state.value == pytest.approx(2 * h)  # held as an alarmed CUSUM is
    assert fired[True] == 1 and fired[False] >= 2


async def test_the_window_test_fires_only_at_or_below_the_mildest_level() -> None:
    """A dip to 0.7 over 100,000 trials is certain evidence that acceptance is below 0.75, but not
    of a fall to 0.45: such a window is left to the CUSUM, whose evidence it does not grow."""
    run = Run(detector_rule(phi=1.0, shift_to=0.45, single_window=True))
    for _ in range(3):
        state = await run.window(0.70, trials=100_000, exact=True)
        assert state.detector is not None and state.detector["evidence"] > 10 * state.threshold
        assert state.value == 0.0
    assert run.events == []


async def test_the_window_test_uses_the_windows_own_dispersion_learned_in_the_warm_up() -> None:
    run = Run(detector_rule(in_control="learn", shift_to=None, drop=0.3, single_window=True))
    for _ in range(10):
        await run.window(0.75)
    state = await run.window(0.75)
    assert state.detector is not None
    warm = Dispersion.from_json(state.detector["warmup"])
    assert warm.window_phi is not None and warm.phi is not None and warm.window_phi <= warm.phi
    trials, alpha = state.detector["trials"], state.detector["alpha"]
    expected = (
        trials / warm.window_phi * kl(alpha, state.detector["alpha0"])
        if alpha < state.detector["alpha0"]
        else 0.0
    )
    assert state.detector["evidence"] == pytest.approx(expected)


async def test_without_the_window_test_h_counts_only_the_levels() -> None:
    on = Run(detector_rule(phi=1.0, shift_to=[0.6, 0.45], single_window=True))
    off = Run(detector_rule(phi=1.0, shift_to=[0.6, 0.45], single_window=False))
    h = threshold(30 * 86400 / INTERVAL)
    assert (await on.window(0.75)).threshold == pytest.approx(h + math.log(3))
    assert (await off.window(0.75)).threshold == pytest.approx(h + math.log(2))
