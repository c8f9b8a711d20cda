"""The two rules the collapse detector benchmark compares, the shipped pack's ``acceptance_collapse``
(or one of its settings changed) and ``acceptance_fallback``, each evaluated by specguard's own
``daemon.evaluation.evaluate_rule`` on answers the benchmark sets, its clock passed in."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from benchmarks.collapse_traffic import WINDOW
from specguard.config.loading import LoadedRule
from specguard.config.loading import load as load_config
from specguard.daemon.evaluation import evaluate_rule
from specguard.rules.signals import Signal
from specguard.sources.base import Series, SourceResult
from specguard.store.records import SeriesState, State

LABELS = {"instance": "vllm-a:8000", "model_name": "m"}


class Answer:
    """A source whose answer the benchmark sets before each evaluation."""

    kind = "scrape"

    def __init__(self) -> None:
        self.result = SourceResult()

    async def refresh(self) -> None:
        return None

    async def query_signal(self, signal: Signal, *_: Any, **__: Any) -> SourceResult:
        return self.result

    async def query_expr(self, expr: str) -> SourceResult:
        raise AssertionError(expr)

    async def close(self) -> None:
        return None


@dataclass
class Judge:
    """One rule, evaluated on its own schedule, its states carried along."""

    item: LoadedRule
    source: Answer = field(default_factory=Answer)
    states: dict[str, SeriesState] = field(default_factory=dict)
    fired: list[float] = field(default_factory=list)

    async def evaluate(self, result: SourceResult, now: float) -> None:
        self.source.result = result
        interval = self.item.rule.interval or WINDOW
        outcome, _ = await evaluate_rule(self.item, self.source, None, self.states, now, interval)  # type: ignore[arg-type]
        self.states = outcome.states
        self.fired += [e.at for e in outcome.events if e.kind is State.FIRING]


def detector_answer(accepted: float, failures: float) -> SourceResult:
    trials = accepted + failures
    if trials <= 0:
        return SourceResult()
    return SourceResult(series=(Series(dict(LABELS), accepted / trials, trials),))


def playbook_answer(accepted: float, draft_tokens: float) -> SourceResult:
    return SourceResult.of([(LABELS, accepted / draft_tokens)]) if draft_tokens > 0 else SourceResult()


@dataclass(frozen=True)
class Variant:
    """The shipped detector rule, or one of its settings changed."""

    name: str = "shipped"
    interval: float | None = None
    drop: tuple[float, ...] | None = None
    phi: float | None = None  # a fixed dispersion instead of the warm-up's
    single_window: bool | None = None  # the window test on or off


SHIPPED = Variant()


def rules(variant: Variant = SHIPPED) -> tuple[LoadedRule, LoadedRule]:
    loaded = load_config(None)
    by_name = {item.name: item for item in loaded.enabled_rules()}
    detector, playbook = by_name["acceptance_collapse"], by_name["acceptance_fallback"]
    rule, detect = detector.rule, detector.rule.detect
    assert detect is not None
    if variant.drop is not None:
        detect = detect.model_copy(update={"drop": list(variant.drop)})
    if variant.phi is not None:
        detect = detect.model_copy(update={"phi": variant.phi})
    if variant.single_window is not None:
        detect = detect.model_copy(update={"single_window": variant.single_window})
    if variant != SHIPPED:
        changed = rule.model_copy(update={"interval": variant.interval or rule.interval, "detect": detect})
        detector = replace(detector, rule=changed)
    return detector, playbook


def window_of(item: LoadedRule) -> float:
    return item.rule.interval or WINDOW


def warmup_windows(item: LoadedRule) -> int:
    detect = item.rule.detect
    assert detect is not None
    return math.ceil(detect.warmup / window_of(item))
