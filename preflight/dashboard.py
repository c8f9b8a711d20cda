"""Whether a Grafana dashboard file is current with the signal catalog (``rules.signals``): every
vLLM metric it queries is spelled as the catalog spells it now (not a name vLLM renamed or dropped,
such as ``vllm:gpu_cache_usage_perc`` or ``vllm:spec_decode_draft_acceptance_rate``), every
``specguard_*`` metric is one the daemon exports (``metrics.registry``), and every catalog signal the
config's enabled rules evaluate on vLLM's metrics has a query reading it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specguard.config.loading import Loaded

_VLLM = re.compile(r"vllm:[a-zA-Z0-9_:]+")
_OWN = re.compile(r"\bspecguard_[a-zA-Z0-9_]+")
_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass
class DashboardCheck:
    queries: int = 0
    problems: list[str] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)  # the rules' signals found on it


def _panels(panels: Any) -> Iterator[Mapping[str, Any]]:
    for panel in panels if isinstance(panels, list) else ():
        if isinstance(panel, Mapping):
            yield panel
            yield from _panels(panel.get("panels"))


def queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every query: panel targets, annotations, template variables."""
    found: list[tuple[str, str]] = []
    for panel in _panels(dashboard.get("panels")):
        for target in panel.get("targets") or ():
            if isinstance(target, Mapping) and isinstance(target.get("expr"), str):
                found.append((f"panel {panel.get('title', panel.get('id'))!r}", target["expr"]))
    annotations = dashboard.get("annotations")
    for annotation in annotations.get("list") or () if isinstance(annotations, Mapping) else ():
        if isinstance(annotation, Mapping) and isinstance(annotation.get("expr"), str):
            found.append((f"annotation {annotation.get('name')!r}", annotation["expr"]))
    templating = dashboard.get("templating")
    for variable in templating.get("list") or () if isinstance(templating, Mapping) else ():
        query = variable.get("query") if isinstance(variable, Mapping) else None
        query = query.get("query") if isinstance(query, Mapping) else query
        if isinstance(query, str) and variable.get("type") == "query":
            found.append((f"variable {variable.get('name')!r}", query))
    return found


def _family(name: str, families: set[str]) -> str:
    """The metric family a series name belongs to (``x_bucket`` -> ``x`` when ``x`` is one)."""
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            return name.removesuffix(suffix)
    return name


def own_metrics() -> set[str]:
    """Every series name the daemon's /metrics can have."""
    from specguard.metrics.registry import DaemonMetrics

    names: set[str] = set()
    for family in DaemonMetrics().registry.collect():
        kind = family.type
        if kind == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif kind == "histogram":
            names |= {family.name, *(family.name + s for s in (*_SUFFIXES, "_created"))}
        else:
            names.add(family.name)
    return names


def check_dashboard(path: Path, loaded: Loaded) -> DashboardCheck:
    """The dashboard file against the catalog; OSError or ValueError when it cannot be read."""
    from specguard.rules.signals import CATALOG

    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, Mapping):
        raise ValueError("not a Grafana dashboard (a JSON object)")
    data = data.get("dashboard", data) if "panels" not in data else data  # an API export wraps it
    newest: dict[str, str] = {}  # every name the catalog knows -> its newest spelling
    for signal in CATALOG.values():
        for metric in (signal.metric, signal.denominator):
            if metric is not None:
                newest.update({name: metric.names[0] for name in metric.names})
    families = set(newest.values())
    own = own_metrics()
    result = DashboardCheck()
    read: set[str] = set()
    found = queries(data)
    result.queries = len(found)
    for where, expr in found:
        for name in dict.fromkeys(_VLLM.findall(expr)):
            family = _family(name, set(newest))
            if family not in newest:
                result.problems.append(f"{where}: vLLM has no {name} (not in the signal catalog)")
            elif newest[family] != family:
                result.problems.append(f"{where}: {name} is vLLM's old name: now {newest[family]}")
            else:
                read.add(_family(family, families))
        for name in dict.fromkeys(_OWN.findall(expr)):
            if name not in own and not name.startswith("specguard_route_"):  # the router's: the catalog's
                result.problems.append(f"{where}: the daemon exports no {name}")
            read.add(name)
    for rule in loaded.enabled_rules():
        evaluated = CATALOG.get(rule.rule.signal or "")
        if evaluated is None:
            continue
        name = _family(evaluated.metric.names[0], families)
        if not name.startswith("vllm:"):
            continue
        if name in read:
            result.signals.append(evaluated.name)
        else:
            result.problems.append(
                f"no query reads {name}: signal {evaluated.name}, which rule {rule.name} evaluates"
            )
    result.signals = sorted(set(result.signals))
    return result
