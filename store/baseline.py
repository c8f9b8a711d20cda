"""The baseline file: measured reference values per model (and optionally per server).

A latency rule compares against the baseline of the model the series serves; the speedup estimate
reads the draft's cost from it. Version 2 holds entries; version 1 (one set of values) still works::

    {"version": 2, "measured_at": "2026-11-30T10:00:00Z", "method": "specguard bench, 200 requests",
     "entries": [
       {"model": "llama-70b", "signals": {"e2e_latency_p95": 1.84, "ttft_p95": 0.21},
        "speculative": {"method": "eagle3"}},
       {"model": "llama-70b", "instance": "10.0.0.7:8000", "signals": {"e2e_latency_p95": 2.10}},
       {"signals": {"e2e_latency_p95": 1.5}, "speculative": {"draft_cost": 0.1}}
     ]}

A series uses the most specific entry that fits its labels: model and instance, then model, then
instance, then the entry that names neither (the default). A series that fits none is an *error*
("no baseline entry for model X"), never a breach. A version 1 file is one entry: for its ``model``
when it names one, otherwise the default.

``speculative.draft_cost`` is c, the time of one draft step over one target step. Without it, the
method gives a default: 0 for n-gram and suffix lookup (no model runs), 0.05 for the drafting heads
(EAGLE, Medusa, MTP...: about one layer of the target, and Leviathan et al. never saw c above 0.05).
A separate draft model has no default: give its cost, about its parameter count over the target's.

Where the values come from matters. A rule computes ``e2e_latency_p95`` from vLLM's histogram
(``histogram_quantile`` over the buckets' increases, interpolated inside vLLM's wide buckets), which
reads higher than the same requests timed by a client: every request between 0.5 and 0.6 s reads
0.78 s. ``specguard bench`` therefore writes ``signals`` computed from vLLM's ``/metrics`` the way the
rules compute them (``signals_from: vllm_metrics``) and keeps what its client timed beside them in
``client``, with the plain server's figures under ``without_speculation`` after an A/B run. An entry
written by an older ``specguard bench`` holds client figures in ``signals``: it still works, and
``specguard check`` warns that its latency values are not comparable with the rules'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from specguard.rules.signals import CATALOG

# Methods whose proposer is a lookup, not a model: c ~= 0.
LOOKUP_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})
# Methods that draft with a small head on the target's hidden states: about one target layer.
HEAD_METHODS = frozenset(
    {
        "eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "deepseek_mtp", "ernie_mtp", "qwen3_next_mtp",
        "mimo_mtp", "longcat_flash_mtp", "glm4_moe_mtp", "pangu_ultra_moe_mtp", "dflash", "dspark",
    }
)  # fmt: skip
HEAD_DRAFT_COST = 0.05

# What a client timed, beside the signals (same names where the figure is the same quantity).
CLIENT_FIGURES = (
    "e2e_latency_p50", "e2e_latency_p95", "e2e_latency_p99", "e2e_latency_mean", "ttft_p95",
    "itl_p50", "itl_p95", "tpot_p50", "tpot_p95", "tpot_mean", "output_throughput",
)  # fmt: skip
# How much faster the speculative server was than the plain one: its median TPOT and e2e over ours.
SPEEDUPS = ("tpot", "e2e")


def _known_signal(name: str) -> str:
    if name not in CATALOG:
        raise ValueError(f"unknown signal {name!r}; known: {', '.join(sorted(CATALOG))}")
    return name


def _baseline_value(number: float) -> float:
    if not math.isfinite(number) or number < 0:
        raise ValueError("a baseline value must be a finite number >= 0")
    return number


def _client_figure(name: str) -> str:
    if name not in CLIENT_FIGURES:
        raise ValueError(f"unknown client figure {name!r}; known: {', '.join(CLIENT_FIGURES)}")
    return name


def _speedup(name: str) -> str:
    if name not in SPEEDUPS:
        raise ValueError(f"unknown speedup {name!r}; known: {', '.join(SPEEDUPS)}")
    return name


BaselineSignal = Annotated[str, AfterValidator(_known_signal)]
BaselineValue = Annotated[float, AfterValidator(_baseline_value)]
ClientFigure = Annotated[str, AfterValidator(_client_figure)]
Speedup = Annotated[str, AfterValidator(_speedup)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Speculative(_Strict):
    """How the speculative decoding of a model drafts: what its cost per step is."""

    method: str | None = None
    draft_cost: float | None = Field(None, ge=0, le=10)

    def cost(self) -> float | str:
        """c, or why it is unknown."""
        if self.draft_cost is not None:
            return self.draft_cost
        if self.method in LOOKUP_METHODS:
            return 0.0
        if self.method in HEAD_METHODS:
            return HEAD_DRAFT_COST
        what = f"method {self.method!r}" if self.method else "no method"
        return (
            f"the baseline gives {what} and no speculative.draft_cost: set draft_cost (for a draft "
            "model, about its parameter count / the target's)"
        )


class WithoutSpeculation(_Strict):
    """The same prompts on a server without speculative decoding (``specguard bench --against``):
    what speculation bought."""

    vllm_version: str | None = None
    signals: dict[BaselineSignal, BaselineValue] = Field(default_factory=dict)
    client: dict[ClientFigure, BaselineValue] = Field(default_factory=dict)
    speedup: dict[Speedup, BaselineValue] = Field(default_factory=dict)


class Entry(_Strict):
    model: str | None = None
    instance: str | None = None
    signals: dict[BaselineSignal, BaselineValue] = Field(default_factory=dict)
    # vllm_metrics: computed from vLLM's /metrics as the rules compute them; client: timed by a
    # client (not comparable with the rules' latency figures); absent: not said.
    signals_from: Literal["vllm_metrics", "client"] | None = None
    client: dict[ClientFigure, BaselineValue] = Field(default_factory=dict)
    without_speculation: WithoutSpeculation | None = None
    speculative: Speculative | None = None
    # Where the values come from (`specguard bench` writes them): when, how, against which vLLM.
    measured_at: datetime | None = None
    measured_with: str = ""
    vllm_version: str | None = None

    def client_latencies(self) -> list[str]:
        """The latency signals of this entry that a client timed: all of them when it says so, or
        when an older ``specguard bench`` wrote it (it did not say, and kept no client figures
        apart); none otherwise."""
        timed_by_client = self.signals_from == "client" or (
            self.signals_from is None and self.measured_with.startswith("specguard bench") and not self.client
        )
        if not timed_by_client:
            return []
        return [name for name in self.signals if CATALOG[name].unit == "seconds"]

    def client_figures_warning(self) -> str | None:
        """What ``specguard check`` says of an entry whose latency values a client timed."""
        names = self.client_latencies()
        if not names:
            return None
        return (
            f"{self.describe()} holds client figures only ({', '.join(names)} as a client timed them, "
            "written by an older specguard bench); the rules compute these from vLLM's histograms, "
            "which read higher (interpolated inside vLLM's buckets: requests of 0.5-0.6 s read "
            "0.78 s), so a latency rule may fire on a healthy server: measure it again with "
            "`specguard bench --write-baseline`"
        )

    def fits(self, labels: Mapping[str, str]) -> bool:
        return (self.model is None or labels.get("model_name") == self.model) and (
            self.instance is None or labels.get("instance") == self.instance
        )

    @property
    def specificity(self) -> int:
        return 2 * (self.model is not None) + (self.instance is not None)

    def describe(self) -> str:
        parts = [
            f"model {self.model}" if self.model else "",
            f"instance {self.instance}" if self.instance else "",
        ]
        return (
            "the baseline entry for " + " and ".join(p for p in parts if p)
            if any(parts)
            else "the default baseline"
        )


class _Header(_Strict):
    measured_at: datetime
    method: str = ""
    vllm_version: str | None = None
    notes: str = ""


class BaselineV1(_Header):
    version: Literal[1] = 1
    model: str | None = None
    signals: dict[BaselineSignal, BaselineValue] = Field(min_length=1)
    speculative: Speculative | None = None


class BaselineV2(_Header):
    version: Literal[2]
    entries: list[Entry] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> BaselineV2:
        seen: set[tuple[str | None, str | None]] = set()
        for entry in self.entries:
            key = (entry.model, entry.instance)
            if key in seen:
                who = entry.describe().removeprefix("the baseline entry for ").removeprefix("the ")
                raise ValueError(f"two entries for {who}: keep one")
            seen.add(key)
        return self


class Baseline:
    """A loaded baseline file, either version."""

    def __init__(self, data: BaselineV1 | BaselineV2) -> None:
        self.data = data
        if isinstance(data, BaselineV1):
            self.entries = [Entry(model=data.model, signals=data.signals, speculative=data.speculative)]
        else:
            self.entries = list(data.entries)

    @property
    def version(self) -> int:
        return self.data.version

    def entry_for(self, labels: Mapping[str, str]) -> Entry | str:
        """The most specific entry for a series with ``labels``, or why there is none."""
        fitting = [entry for entry in self.entries if entry.fits(labels)]
        if fitting:
            return max(fitting, key=lambda entry: entry.specificity)
        model = labels.get("model_name")
        if model is None:
            return "the baseline has no default entry, and the series has no model_name to choose one by"
        return f"the baseline has no entry for model {model!r} and no default entry"

    def signals_named(self) -> set[str]:
        return {name for entry in self.entries for name in entry.signals}

    def value(self, labels: Mapping[str, str], signal: str) -> float | str:
        """The baseline's ``signal`` for a series with ``labels``, or why it is unknown."""
        entry = self.entry_for(labels)
        if isinstance(entry, str):
            return entry
        if signal not in entry.signals:
            return f"{entry.describe()} has no value for {signal!r}"
        return entry.signals[signal]

    def draft_cost(self, labels: Mapping[str, str]) -> float | str:
        """c for a series with ``labels``, or why it is unknown."""
        entry = self.entry_for(labels)
        if isinstance(entry, str):
            return entry
        if entry.speculative is None:
            return f"{entry.describe()} says nothing of the speculative method: set speculative.method or draft_cost"
        return entry.speculative.cost()


def parse_baseline(raw: object) -> Baseline:
    """Validate a baseline file's content. Raises pydantic.ValidationError."""
    version = raw.get("version", 1) if isinstance(raw, Mapping) else 1
    if version == 2:
        return Baseline(BaselineV2.model_validate(raw))
    return Baseline(BaselineV1.model_validate(raw))
