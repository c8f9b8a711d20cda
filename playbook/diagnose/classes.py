"""Case 2, acceptance collapses on some prompts only: the acceptance of each traffic class, the
classes far below the rest, and the routing rule that sends them to the fallback (standard) pool.

vLLM counts drafts per server, not per request, so a class has an acceptance of its own only where
its drafts were counted apart:

- **the router's series** (history, Prometheus or a scrape): the requests of each class and pool
  (``route:n:<pool>:<class>``), and the acceptance of each pool's servers (the routing section's
  ``pools``, ``host:port``, matched with the series' instance, as the report matches them). A pool
  that speculated holds the classes the router sent it; classes that share a pool share its figure;
- **a ``specguard bench --json`` result** (``Evidence.bench``): the acceptance of each routing class
  that had a phase to itself (``routing.classes``), else of each prompt class (``phases``).

The rule, per group (a class, or the classes of one pool) with at least MIN_DRAFTS drafts, against
the pooled acceptance of the other such groups (their accepted / draft tokens): **far below** is
under LOW (the playbook's line for a low acceptance) *and* under FAR times the rest's, and is
``cause found``; under LOW and under NEAR times the rest's is ``suspect``; otherwise ``fine``.
Fewer than two groups to compare is ``unknown``, with why. An acceptance low on every class alike is
not this case (case 1 says why the server is slow).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specguard.config.routing import MALFORMED_CLASS, OTHER_CLASS
from specguard.metrics import figures as fig
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Figure, Finding, Verdict
from specguard.playbook.diagnose.reroute import Reroute, class_name, reroute
from specguard.store.history import route_parts

CASE = "class_collapse"
TITLE = "Acceptance collapses on some prompts only"
MIN_DRAFTS = 200  # drafts a group needs before its acceptance is compared
LOW = 0.5  # the playbook's line: acceptance under it is low
FAR = 0.5  # far below: under half the other classes' pooled acceptance
NEAR = 0.75  # suspect: under LOW and under three quarters of the rest's
NOT_TRAFFIC = (MALFORMED_CLASS, OTHER_CLASS)  # bodies vLLM refuses, paths not inspected: no drafts
UNROUTED = "(no header)"  # bench's name for answers that did not come through the router
RULE = (
    f"a class is far below the rest when its acceptance is under {LOW} and under {FAR:g} x the other "
    f"classes' pooled acceptance; suspect when under {LOW} and under {NEAR:g} x; each class needs "
    f"{MIN_DRAFTS} drafts or more, and two such classes are needed to compare"
)
RELOAD = (
    "then check and apply it: specguard check --config specguard.yaml && specguard routing render "
    "--config specguard.yaml --out /etc/nginx/specguard && nginx -t && nginx -s reload"
)


@dataclass(frozen=True)
class Group:
    """One acceptance figure and the classes it is about."""

    classes: tuple[str, ...]
    kind: str  # "routing" (the router's classes) or "prompt" (bench's prompt classes)
    pool: str | None
    accepted: float
    draft_tokens: float
    drafts: float
    source: str
    requests: float | None = None

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def label(self) -> str:
        what = ("class " if len(self.classes) == 1 else "classes ") + ", ".join(self.classes)
        what = f"prompt {what}" if self.kind == "prompt" else what
        return f"{what} (pool {self.pool})" if self.pool else what


@dataclass
class Source:
    """What one source of per-class figures says."""

    name: str  # "router" or "bench"
    groups: list[Group] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what it could not read
    states: dict[int, tuple[str, float | None]] = field(default_factory=dict)  # group index -> (state, rest)
    model: str = ""  # bench's served model (for a prompt class's rule)

    @property
    def judged(self) -> list[int]:
        return [i for i, (state, _) in self.states.items() if state != "too few drafts"]

    def verdict(self) -> Verdict:
        found = {state for state, _ in self.states.values()}
        if len(self.judged) < 2:
            return Verdict.UNKNOWN
        if "far below" in found:
            return Verdict.CAUSE_FOUND
        return Verdict.SUSPECT if "low" in found else Verdict.FINE


def _window(evidence: Evidence) -> str:
    def at(moment: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(moment))

    return f"{evidence.source} {at(evidence.start)} to {at(evidence.end)} UTC"


def from_router(evidence: Evidence) -> Source:
    """One group per pool whose servers drafted: the classes the router sent it."""
    source = Source("router")
    if evidence.routing is None:
        source.notes.append(
            "router: the config has no routing: section, so which servers each class reached is unknown"
        )
        return source
    if not evidence.routes:
        source.notes.append(
            "router: no router series in the window (its admin /specguard/metrics is not a scrape "
            "target, or nothing went through it)"
        )
        return source
    parts, _ = fig.total(span for spans in evidence.routes.values() for span in spans)
    sent: dict[str, dict[str, float]] = {}  # pool -> class -> requests
    for key, value in parts.items():
        parsed = route_parts(key)
        if parsed is not None and parsed[0] == "n" and value > 0 and parsed[2] not in NOT_TRAFFIC:
            by_class = sent.setdefault(parsed[1], {})
            by_class[parsed[2]] = by_class.get(parsed[2], 0.0) + value
    where = _window(evidence)
    for name, pool in evidence.routing.pools.items():
        members = set(pool.servers)
        found = [spans for (instance, _), spans in evidence.servers.items() if instance in members]
        classes = sent.get(name, {})
        if not found:
            if classes:
                source.notes.append(
                    f"router: pool {name}: none of its servers ({', '.join(pool.servers)}) is in the "
                    "window's series (a scrape target's instance must be host:port as routing.pools gives it)"
                )
            continue
        counted, _ = fig.total(span for spans in found for span in spans)
        drafts = counted.get("drafts", 0.0)
        if drafts <= 0:
            continue  # no speculation there (the standard pool), or nothing sent
        if not classes:
            source.notes.append(
                f"router: pool {name}: its servers drafted, but the router sent it no request in the window"
            )
            continue
        ordered = tuple(sorted(classes, key=lambda c: (-classes[c], c)))
        source.groups.append(
            Group(
                ordered,
                "routing",
                name,
                counted.get("accepted", 0.0),
                counted.get("draft_tokens", 0.0),
                drafts,
                f"{where}, pool {name}'s servers",
                sum(classes.values()),
            )
        )
    if len(source.groups) == 1 and len(source.groups[0].classes) > 1:
        only = source.groups[0]
        source.notes.append(
            f"router: only pool {only.pool} speculated, for {', '.join(only.classes)}: vLLM counts drafts "
            "per server, so classes that share a pool share one acceptance (give the classes pools of "
            "their own, or compare them with `specguard bench --json` per class: --bench FILE)"
        )
    elif not source.groups:
        source.notes.append("router: no pool's servers made a draft for routed requests in the window")
    return source


def _bench_group(name: str, kind: str, pool: str | None, measured: Any, notes: list[str]) -> Group | None:
    label = f"bench: {'routing' if kind == 'routing' else 'prompt'} class {name}"
    if not isinstance(measured, Mapping):
        return None  # no speculation there, or no acceptance of its own (bench says why)
    if "error" in measured:
        notes.append(f"{label}: {measured['error']}")
        return None
    try:
        accepted, tokens, drafts = (
            float(measured[key]) for key in ("accepted_tokens", "draft_tokens", "drafts")
        )
    except (KeyError, TypeError, ValueError):
        notes.append(f"{label}: its acceptance has no accepted_tokens, draft_tokens and drafts")
        return None
    return Group((name,), kind, pool, accepted, tokens, drafts, "bench --json")


def from_bench(evidence: Evidence) -> Source:
    """The routing classes that had a phase to themselves, when two or more did; else the prompt
    classes (bench's phases)."""
    source = Source("bench")
    bench = evidence.bench
    if bench is None:
        source.notes.append("bench: none given (--bench FILE: a `specguard bench --json` result)")
        return source
    server = bench.get("server")
    source.model = str(server.get("model") or "") if isinstance(server, Mapping) else ""
    routing = bench.get("routing")
    routed = routing.get("classes") if isinstance(routing, Mapping) else None
    notes: list[str] = []
    if isinstance(routed, Mapping):
        for name, entry in routed.items():
            if name != UNROUTED and isinstance(entry, Mapping):
                group = _bench_group(str(name), "routing", entry.get("pool"), entry.get("acceptance"), notes)
                if group is not None:
                    source.groups.append(group)
    if sum(g.drafts >= MIN_DRAFTS for g in source.groups) >= 2:
        source.notes += notes
        return source
    source.groups, notes = [], []
    phases = bench.get("phases")
    if not isinstance(phases, Mapping) or not phases:
        source.notes.append("bench: the result has no phases (not a `specguard bench --json` output?)")
        return source
    for name, phase in phases.items():
        if isinstance(phase, Mapping):
            group = _bench_group(str(name), "prompt", None, phase.get("acceptance"), notes)
            if group is not None:
                source.groups.append(group)
    source.notes += notes
    if not source.groups:
        source.notes.append("bench: no class has an acceptance (the server did not speculate, or the "
                            "run did not read its /metrics: --metrics-url)")  # fmt: skip
    return source


def assess(source: Source) -> Source:
    """Each group's state: far below, low, ok, or too few drafts."""
    enough = [i for i, g in enumerate(source.groups) if g.drafts >= MIN_DRAFTS and g.draft_tokens > 0]
    for i, group in enumerate(source.groups):
        if i not in enough:
            source.states[i] = ("too few drafts", None)
            continue
        others = [source.groups[j] for j in enough if j != i]
        tokens = sum(g.draft_tokens for g in others)
        rest = sum(g.accepted for g in others) / tokens if tokens > 0 else None
        rate = group.rate
        state = "ok"
        if rate is not None and rest is not None and rate < LOW:
            state = "far below" if rate < FAR * rest else "low" if rate < NEAR * rest else "ok"
        source.states[i] = (state, rest)
    few = [source.groups[i] for i, (s, _) in source.states.items() if s == "too few drafts"]
    if few:
        source.notes.append(
            f"{source.name}: too few drafts to judge (at least {MIN_DRAFTS} each): "
            + ", ".join(f"{g.label} {g.drafts:.0f}" for g in few)
        )
    return source


async def judge(evidence: Evidence) -> Finding:
    sources = [assess(from_router(evidence)), assess(from_bench(evidence))]
    order = (Verdict.CAUSE_FOUND, Verdict.SUSPECT, Verdict.FINE, Verdict.UNKNOWN)
    chosen = min(sources, key=lambda s: order.index(s.verdict()))
    verdict = chosen.verdict()
    figures = tuple(f for s in sources for f in _figures(s))
    details: dict[str, object] = {
        "rule": RULE,
        "sources": {s.name: _table(s) for s in sources},
        "notes": [n for s in sources for n in s.notes],
    }
    if verdict is Verdict.UNKNOWN:
        missing = tuple(n for s in sources for n in s.notes) or ("no per-class acceptance",)
        return Finding(CASE, TITLE, verdict, "not enough data to compare the classes' acceptance",
                       figures, (), missing, details)  # fmt: skip
    marked = [(chosen.groups[i], rest) for i, (state, rest) in chosen.states.items()
              if state == ("far below" if verdict is Verdict.CAUSE_FOUND else "low")]  # fmt: skip
    if verdict is Verdict.FINE:
        rates = [chosen.groups[i].rate or 0.0 for i in chosen.judged]
        summary = (f"no class far below the rest: acceptance {min(rates):.2f} to {max(rates):.2f} over "
                   f"{len(rates)} groups ({chosen.name})")  # fmt: skip
        unjudged = tuple(n for n in chosen.notes if "too few drafts" in n)
        return Finding(CASE, TITLE, verdict, summary, figures, (), unjudged, details)
    said = "; ".join(
        f"{g.label} {g.rate or 0.0:.2f} against {rest or 0.0:.2f} for the rest" for g, rest in marked
    )
    if verdict is Verdict.SUSPECT:
        summary = f"low on some classes, not far below the rest ({chosen.name}): {said}"
        remedy = (f"not far enough below the rest to reroute on this evidence ({RULE}): measure longer "
                  "(more drafts), or run `specguard bench --json` with one prompt class per request shape",)  # fmt: skip
        return Finding(CASE, TITLE, verdict, summary, figures, remedy, (), details)
    rule = _remedy(evidence, chosen, [g for g, _ in marked])
    details["routing_rule"] = rule.text
    if rule.problems:
        details["routing_rule_problems"] = list(rule.problems)
    summary = f"collapses on {', '.join(g.label for g, _ in marked)} ({chosen.name}): {said}"
    return Finding(CASE, TITLE, verdict, summary, figures, _steps(rule, chosen, [g for g, _ in marked]),
                   (), details)  # fmt: skip


def _remedy(evidence: Evidence, source: Source, marked: Sequence[Group]) -> Reroute:
    existing = [c for g in marked if g.kind == "routing" for c in g.classes]
    why = {
        c: f"diagnose: acceptance {g.rate or 0.0:.2f}, far below the rest" for g in marked for c in g.classes
    }
    model = source.model or "MODEL"
    new = {c: {"model": f"{model}-{class_name(c)}"} for g in marked if g.kind == "prompt" for c in g.classes}
    return reroute(evidence.routing, existing, new, why)


def _steps(rule: Reroute, source: Source, marked: Sequence[Group]) -> tuple[str, ...]:
    names = ", ".join(c for g in marked for c in g.classes)
    steps: list[str] = []
    if any(g.kind == "prompt" for g in marked):
        model = source.model or "MODEL"
        steps.append(
            f"the router tells requests apart by their shape, not their text: have the clients of the "
            f"{names} prompts send the model name the rule below names, and serve that name on both pools "
            f"(vLLM takes several: --served-model-name {model} {model}-<class>)"
        )
    if rule.text:
        steps.append(f"send {names} to the fallback pool {rule.pool}: in the config's routing: section "
                     "(its other keys stay as they are):")  # fmt: skip
        steps.append(rule.text)
        steps.append(RELOAD)
    steps += [f"could not write: {problem}" for problem in rule.problems]
    return tuple(steps)


def _figures(source: Source) -> list[Figure]:
    out = []
    for i, (state, rest) in source.states.items():
        group = source.groups[i]
        if state == "too few drafts":
            out.append(Figure("drafts", group.drafts, "drafts", f">= {MIN_DRAFTS} to judge: too few",
                              group.source, group.label))  # fmt: skip
            continue
        line = (
            f"far below if < {LOW} and < {FAR * rest:.2f} ({FAR:g} x the rest's {rest:.2f})"
            if rest is not None
            else ""
        )
        out.append(Figure("acceptance_rate", group.rate, "", line, group.source, group.label))
        out.append(Figure("rest_acceptance_rate", rest, "", "the other classes' pooled acceptance",
                          f"{source.name}: the other classes' figures", group.label))  # fmt: skip
        out.append(
            Figure("drafts", group.drafts, "drafts", f">= {MIN_DRAFTS} to judge", group.source, group.label)
        )
    return out


def _table(source: Source) -> list[dict[str, Any]]:
    rows = []
    for i, group in enumerate(source.groups):
        state, rest = source.states.get(i, ("too few drafts", None))
        rows.append({
            "classes": list(group.classes), "kind": group.kind, "pool": group.pool,
            "requests": group.requests, "drafts": group.drafts, "draft_tokens": group.draft_tokens,
            "accepted_tokens": group.accepted, "acceptance_rate": group.rate,
            "mean_acceptance_length": 1 + group.accepted / group.drafts if group.drafts > 0 else None,
            "rest_acceptance_rate": rest, "state": state, "source": group.source,
        })  # fmt: skip
    return rows
