"""What a compatibility check found: its verdict, its evidence, and the report they make up."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    OK = "ok"
    WARNING = "warning"  # vLLM runs the pair, but acceptance or behaviour suffers somewhere
    INCOMPATIBLE = "incompatible"  # vLLM refuses the pair, or runs it on ids that mean other text

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Verdict.OK: 0, Verdict.WARNING: 1, Verdict.INCOMPATIBLE: 2}
EXIT_CODES = {Verdict.OK: 0, Verdict.WARNING: 1, Verdict.INCOMPATIBLE: 2}


@dataclass(frozen=True)
class Check:
    """One check: ``area`` (tokenizer, chat template, config, draft head), its name, the verdict,
    one line of evidence, further lines (examples) and the figures behind it for ``--json``."""

    area: str
    name: str
    verdict: Verdict
    evidence: str
    details: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """A model as the report names it: as given, where it was found, and from where."""

    name: str
    path: str
    source: str  # "local" (a directory) or "cache" (a Hugging Face cache snapshot) or "download"


@dataclass(frozen=True)
class Report:
    target: ModelInfo
    draft: ModelInfo
    method: str  # the kind of draft: draft_model, eagle, eagle3, mtp
    method_source: str  # how it was told: "--method", or what in the draft's config or name said so
    checks: tuple[Check, ...]

    @property
    def verdict(self) -> Verdict:
        return max((c.verdict for c in self.checks), key=lambda v: v.rank, default=Verdict.OK)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def counts(self) -> dict[str, int]:
        return {v.value: sum(1 for c in self.checks if c.verdict is v) for v in Verdict}


def worst(*verdicts: Verdict) -> Verdict:
    return max(verdicts, key=lambda v: v.rank, default=Verdict.OK)
