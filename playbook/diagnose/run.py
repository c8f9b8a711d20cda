"""The four cases in the playbook's order, each judged on the same evidence.

A case module has ``async def judge(evidence) -> Finding``. A case that fails (a bug, a module
missing from this build) is answered ``unknown`` with the error, never with a traceback, and the
other cases still run.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Finding, Verdict

log = logging.getLogger("specguard.diagnose")

Judge = Callable[[Evidence], Awaitable[Finding]]

# Case number -> (its module, its name in a finding, the playbook's title).
CASES: dict[int, tuple[str, str, str]] = {
    1: ("specguard.playbook.diagnose.slower", "slower", "Slower since speculation was enabled"),
    2: ("specguard.playbook.diagnose.classes", "class_collapse", "Acceptance collapses on some prompts only"),
    3: ("specguard.playbook.diagnose.bursts", "bursty_stream", "Bursty streaming"),
    4: ("specguard.playbook.diagnose.vocabulary", "vocab_mismatch", "Vocabulary mismatch at start-up"),
}


def judge_of(number: int) -> Judge:
    """The ``judge`` of case ``number`` (imported when asked: case 4 needs the playbook extra's
    libraries only inside its own judge)."""
    module = importlib.import_module(CASES[number][0])
    judge: Judge = module.judge
    return judge


async def diagnose(evidence: Evidence, cases: Sequence[int] = tuple(CASES)) -> list[Finding]:
    """The findings of ``cases`` (numbers 1-4), in the playbook's order."""
    out: list[Finding] = []
    for number in sorted(set(cases)):
        _, name, title = CASES[number]
        try:
            finding = await judge_of(number)(evidence)
        except Exception as exc:  # one case's failure is its own answer, not the command's end
            log.debug("case %d failed", number, exc_info=True)
            finding = Finding(
                name, title, Verdict.UNKNOWN, f"the case could not be judged: {type(exc).__name__}: {exc}",
                missing=(f"case {number} failed: {exc}",),
            )  # fmt: skip
        out.append(finding)
    return out


def exit_code(findings: Sequence[Finding]) -> int:
    """0: every case fine; 1: a cause found or a suspect; 3: none of those, but a case unknown."""
    verdicts = {f.verdict for f in findings}
    if verdicts & {Verdict.CAUSE_FOUND, Verdict.SUSPECT}:
        return 1
    if Verdict.UNKNOWN in verdicts:
        return 3
    return 0
