"""Which series each baseline entry judges: the label matchers that give every series to the most
specific baseline entry that fits it, as specguard picks it, so that one exported rule per entry
judges each series against the threshold specguard would use."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specguard.rules.matchers import Matcher
from specguard.store.baseline import Entry


@dataclass(frozen=True)
class Scope:
    """The series one exported rule judges: label matchers added to the rule's own."""

    matchers: tuple[Matcher, ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        """The labels every selected series has (its ``=`` matchers).

        Written as the rule's labels too: they change no alert (the series carry them already),
        and they keep the rules of one alert name apart, which promtool's duplicate-rule lint wants.
        """
        return {m.label: m.value for m in self.matchers if m.op == "="}

    def describe(self) -> str:
        return ", ".join(m.promql() for m in self.matchers) or "every series"


def _regex_of(values: Iterable[str]) -> str:
    """An RE2 alternation matching exactly ``values`` (Prometheus anchors it at both ends)."""
    return "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value) for value in sorted(set(values)))


def _not_in(label: str, values: Iterable[str]) -> tuple[Matcher, ...]:
    values = set(values)
    return (Matcher(label, "!~", _regex_of(values)),) if values else ()


def entry_scopes(entries: Sequence[Entry]) -> list[tuple[Entry, list[Scope]]]:
    """For each baseline entry, the series whose most specific fitting entry it is.

    Mirrors ``Baseline.entry_for``: model and instance beat model, model beats instance, instance
    beats the default. The scopes of all entries are disjoint. The default entry's share can need
    several selectors: a model+instance entry whose model has no entry of its own takes one
    instance of that model away from it, which one matcher per label cannot say.
    """
    models = {e.model for e in entries if e.model is not None and e.instance is None}
    instances = {e.instance for e in entries if e.instance is not None and e.model is None}
    pairs = {(e.model, e.instance) for e in entries if e.model is not None and e.instance is not None}
    out: list[tuple[Entry, list[Scope]]] = []
    for entry in entries:
        if entry.model is not None and entry.instance is not None:
            scopes = [
                Scope((Matcher("model_name", "=", entry.model), Matcher("instance", "=", entry.instance)))
            ]
        elif entry.model is not None:
            taken = {i for m, i in pairs if m == entry.model}
            scopes = [Scope((Matcher("model_name", "=", entry.model), *_not_in("instance", taken)))]
        elif entry.instance is not None:
            taken = models | {m for m, i in pairs if i == entry.instance}
            scopes = [Scope((Matcher("instance", "=", entry.instance), *_not_in("model_name", taken)))]
        else:
            # Pairs not already covered by their model's or their instance's entry.
            left = {(m, i) for m, i in pairs if m not in models and i not in instances}
            left_models = {m for m, _ in left}
            scopes = [Scope((*_not_in("model_name", models | left_models), *_not_in("instance", instances)))]
            for model in sorted(left_models):
                taken = instances | {i for m, i in left if m == model}
                scopes.append(Scope((Matcher("model_name", "=", model), *_not_in("instance", taken))))
        out.append((entry, scopes))
    return out
