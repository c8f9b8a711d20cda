"""Has acceptance recovered? A sequential probability ratio test on a server's own counters, for
the checks that must verify a remedy: the canary before a flag is restored, and the check after
vLLM restarted with fewer speculative tokens.

Requests go to the server in rounds; after each, its ``/metrics`` say what those requests drafted
(and whatever else it served meanwhile): S accepted tokens and F drafts that ended in a rejection
(drafts minus the last position's count, as ``token_acceptance`` counts them). Wald's test adds up
the evidence, round by round, until it says *recovered* (acceptance back at ``in_control``) or
*collapsed* (still at ``shift_to``) with the stated error rates, or runs out of rounds
(*undecided*, which verifies nothing). See ``common.sequential``.

Each round's evidence is divided by the round's own dispersion: its requests differ from one
another (``spread``), and each carries about ``max_tokens`` trials at most (a trial is an accepted
draft token or a rejection, and each comes with a generated token), so a round varies at most
1 + (max_tokens − 1) spread² / (α(1 − α)) times as much as as many independent tokens
(``common.sequential.round_dispersion``). Not the collapse detector's φ: that one measures a whole
server's windows, requests carried from one to the next, tens of times larger, and would hold the
test undecided round after round. Traffic the server serves during a round is counted too: the
canary's server has none (its traffic is on the fallback); a restart's check without ``drain``
may have some, whose requests add their own trials to the round.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specguard.common.sequential import Decision, Sprt, alpha_hat, chain_trials, round_dispersion

ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
SHORT_DRAFTS_TOLERANCE = 0.01  # as the token_acceptance signal's


class SprtParams(BaseModel):
    """``sprt:``: decide between acceptance back at ``in_control`` and still at ``shift_to``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    in_control: float = Field(gt=0, lt=1)  # per-token acceptance when healthy (token_acceptance)
    shift_to: float = Field(gt=0, lt=1)  # ... and when collapsed
    # How much one request's per-token acceptance differs from another's (a standard deviation):
    # the simulator's --acceptance-spread, 0.1 in its benchmarks; 0.15 leaves room for real
    # traffic's wider mix. With 0 (every request alike) the rounds are binomial.
    spread: float = Field(0.15, ge=0, lt=0.5)
    # A fixed dispersion per round instead of the one ``spread`` gives (see the module's text).
    phi: float | None = Field(None, ge=1)
    false_recovery: float = Field(0.01, gt=0, lt=0.5)  # P(called recovered | still collapsed)
    false_collapse: float = Field(0.05, gt=0, lt=0.5)  # P(called collapsed | recovered)
    rounds: int = Field(8, ge=1, le=100)  # at most this many rounds of requests

    @model_validator(mode="after")
    def _below(self) -> SprtParams:
        if self.shift_to >= self.in_control:
            raise ValueError(f"shift_to ({self.shift_to:g}) must lie below in_control ({self.in_control:g})")
        for alpha in (self.in_control, self.shift_to):
            round_dispersion(1, self.spread, alpha)  # raises, saying why, for a spread no Beta has
        return self

    def dispersion(self, max_tokens: int) -> float:
        """φ of a round of requests of at most ``max_tokens`` tokens each: ``phi`` when given, else
        the larger of the round's dispersions under the two hypotheses, so that the error rates
        hold under both."""
        if self.phi is not None:
            return self.phi
        return max(round_dispersion(max_tokens, self.spread, a) for a in (self.in_control, self.shift_to))

    def test(self, max_tokens: int) -> Sprt:
        """Wald's test for rounds of requests of at most ``max_tokens`` tokens each."""
        phi = self.dispersion(max_tokens)
        return Sprt(self.in_control, self.shift_to, phi, self.false_recovery, self.false_collapse)


@dataclass(frozen=True)
class Totals:
    """The speculative-decoding counters of one ``/metrics`` page, summed over engines and models
    (``full``: each engine's last position, the drafts it accepted whole)."""

    accepted: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    full: float = 0.0
    expected_tokens: float = 0.0  # drafts x k, engine by engine

    def minus(self, earlier: Totals) -> Totals:
        return Totals(
            self.accepted - earlier.accepted,
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.full - earlier.full,
            self.expected_tokens - earlier.expected_tokens,
        )


def totals(page: str) -> Totals:
    accepted = drafts = draft_tokens = 0.0
    per_engine: dict[tuple[tuple[str, str], ...], list[float]] = {}
    drafts_by_engine: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if not sample.name.endswith("_total"):
                continue  # _created and the like
            engine = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "position"))
            if name == ACCEPTED:
                accepted += sample.value
            elif name == DRAFTS:
                drafts += sample.value
                drafts_by_engine[engine] = drafts_by_engine.get(engine, 0.0) + sample.value
            elif name == DRAFT_TOKENS:
                draft_tokens += sample.value
            elif name == PER_POSITION:
                per_engine.setdefault(engine, []).append(sample.value)
    full = sum(min(values) for values in per_engine.values())
    expected = sum(d * len(per_engine.get(engine, ())) for engine, d in drafts_by_engine.items())
    return Totals(accepted, drafts, draft_tokens, full, expected)


# The largest count a float holds exactly: a counter past it cannot be told from its neighbours.
MOST_COUNT = float(2**53)
_COUNTERS = {
    "accepted": "accepted tokens",
    "drafts": "drafts",
    "draft_tokens": "draft tokens",
    "full": "drafts accepted whole",
    "expected_tokens": "drafts times their length",
}


class ImpossibleCounters(Exception):
    """A /metrics page whose speculative-decoding counters, or what they grew by, cannot be so;
    the message says what."""


class CountersWentBack(ImpossibleCounters):
    """The counters went back since the last page: the server restarted."""


class Counters:
    """The server's speculative-decoding counters, read page after page and checked: whole,
    finite counts that never go back, and never more tokens accepted than drafted. Every probe of
    acceptance (the canary's and the restart's) reads its pages through one."""

    def __init__(self) -> None:
        self.last: Totals | None = None

    def read(self, page: str) -> Totals:
        """The page's totals; ImpossibleCounters when they, or what they grew by since the last page,
        cannot be so."""
        try:
            now = totals(page)
        except (ValueError, ArithmeticError, LookupError, TypeError) as exc:
            reason = str(exc)[:200] or type(exc).__name__
            raise ImpossibleCounters(f"GET /metrics is not a Prometheus page: {reason}") from None
        for name, said in _COUNTERS.items():
            value = getattr(now, name)
            if not (math.isfinite(value) and 0 <= value <= MOST_COUNT and float(value).is_integer()):
                raise ImpossibleCounters(
                    f"GET /metrics counts {value:g} {said}: not a count a server can have"
                )
        last, self.last = self.last, now
        if last is None:
            return now
        step = now.minus(last)
        if min(step.accepted, step.drafts, step.draft_tokens, step.full) < 0:
            raise CountersWentBack("the server's counters went back (it restarted): try again later")
        if step.accepted > step.draft_tokens:
            grew = f"{step.accepted:,.0f} tokens accepted of {step.draft_tokens:,.0f} drafted"
            if step.draft_tokens == 0:
                raise ImpossibleCounters(f"acceptance is impossible: {grew}")
            raise ImpossibleCounters(
                f"acceptance {step.accepted / step.draft_tokens:.2f} is impossible: accepted tokens "
                f"grew faster than draft tokens ({grew})"
            )
        if step.full > step.drafts:
            raise ImpossibleCounters(
                f"{step.full:,.0f} drafts accepted whole of {step.drafts:,.0f} drafted is impossible"
            )
        return now


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    detail: str
    alpha: float | None = None  # α̂ over every round
    rounds: int = 0


async def sprt_probe(
    params: SprtParams,
    read_metrics: Callable[[], Awaitable[str]],
    send_round: Callable[[], Awaitable[None]],
    what: str,
    max_tokens: int,
) -> Verdict:
    """Rounds of ``send_round`` (requests of at most ``max_tokens`` tokens each) until Wald's test
    decides; ``what`` names the probe in the detail. Raises what the two callables raise (the
    caller reports a server that does not answer), and ImpossibleCounters for a page whose counters
    cannot be so; counters that went back (a restart) decide nothing."""
    sprt = params.test(max_tokens)
    counters = Counters()
    start = before = counters.read(await read_metrics())
    evidence = 0.0
    decision = Decision.UNDECIDED
    done = 0
    while done < params.rounds:
        done += 1
        await send_round()
        try:
            now = counters.read(await read_metrics())
        except CountersWentBack:
            return Verdict(Decision.UNDECIDED, f"{what}: the server's counters went back (it restarted)")
        step = now.minus(before)
        if step.draft_tokens < (1 - SHORT_DRAFTS_TOLERANCE) * step.expected_tokens:
            return Verdict(
                Decision.UNDECIDED,
                f"{what}: drafts carry fewer tokens than k (an ngram proposer?): the chain model's test "
                "would be biased",
            )
        successes, failures = chain_trials(step.accepted, step.drafts, step.full)
        evidence += sprt.evidence(successes, failures)
        before = now
        decision = sprt.decide(evidence)
        if decision is not Decision.UNDECIDED:
            break
    total = before.minus(start)
    successes, failures = chain_trials(total.accepted, total.drafts, total.full)
    alpha = alpha_hat(successes, failures)
    if alpha is None:
        return Verdict(
            Decision.UNDECIDED,
            f"{what}: no drafts in {done} round(s): is speculative decoding on at this server?",
            None,
            done,
        )
    said = {
        Decision.RECOVERED: f"recovered (acceptance back at {params.in_control:g}",
        Decision.COLLAPSED: f"still collapsed (acceptance at {params.shift_to:g}",
        Decision.UNDECIDED: f"undecided after {done} round(s) (neither {params.in_control:g} nor {params.shift_to:g}",
    }[decision]
    rates = (
        f"at most {params.false_recovery:g} of collapses called recovered, {params.false_collapse:g} "
        "of recoveries called collapsed"
    )
    detail = (
        f"{what}: {said}, {rates}): per-token acceptance {alpha:.2f} over {successes + failures:,.0f} "
        f"trials in {done} round(s), evidence {_signed(evidence)} against bounds "
        f"{_signed(sprt.lower)} / {_signed(sprt.upper)} (phi {sprt.phi:.2f} per round)"
    )
    return Verdict(decision, detail, alpha, done)


def _signed(value: float) -> str:
    return f"{value:+.2f}" if math.isfinite(value) else str(value)
