"""Case 4, vocabulary mismatch at start-up: vLLM's own refusal in its log, and ``compat`` on the
serving file's target and draft.

vLLM (0.15 and later) compares the target's and the draft's ``vocab_size`` for ``method:
draft_model`` while it builds its speculative config, and refuses to start when they differ, in
pydantic's words (vLLM 0.32.0, captured in ``tests/fixtures/vllm-0.32.0-startup-vocab-refused.log``):

    pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
      Value error, Target and draft model should have the same vocabulary size. Target model
      vocab_size=512. Draft model vocab_size=384. Using models with different tokenizers ...

The log is the unit's journal (``journalctl -u UNIT --no-pager -o cat -n JOURNAL_LINES``, run
without a shell) or a log file. A start-up begins with vLLM's ``non-default args:`` line (older
releases: ``vLLM API server version``) and is served from uvicorn's ``Application startup
complete.``; the last refusal counts when no start-up was served after it.

``compat`` (transformers, the ``playbook`` extra) compares the pair named by the serving file: its
tokenizer checks, ``vocab_size`` as vLLM compares it and an EAGLE-3 head's reduced vocabulary decide
the verdict here; its other findings (chat template, positions) are listed, not judged.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Figure, Finding, Verdict

CASE = "vocab_mismatch"
TITLE = "Vocabulary mismatch at start-up"
REFUSAL = re.compile(
    r"Target and draft model should have the same vocabulary size\. "
    r"Target model vocab_size=(\d+)\. Draft model vocab_size=(\d+)\."
)
STARTING = ("non-default args:", "vLLM API server version")
SERVED = "Application startup complete."
STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)\b")
JOURNAL_LINES = 20000  # the journal's last lines read: a day of a busy server's access log and more
JOURNAL_TIMEOUT = 30.0
LOG_TAIL = 16 * 2**20  # the last bytes of a log file read
COMPAT_METHODS = ("draft_model", "eagle", "eagle3")  # serving methods with a draft compat compares
VOCABULARY_AREAS = ("tokenizer", "draft head")  # compat's checks that decide this case, with vocab_size


@dataclass(frozen=True)
class LogReading:
    where: str  # "journal of vllm.service", "log file /var/log/vllm.log"
    refusal: tuple[int, int] | None  # (target, draft) vocab_size of the last refusal
    refused_at: str | None  # vLLM's time stamp (month-day time) nearest before it
    starts: int  # start-ups seen
    served: int  # start-ups served
    served_after: bool  # a start-up was served after the last refusal


def read_log(text: str, where: str) -> LogReading:
    refusal: tuple[int, int] | None = None
    at: str | None = None
    stamp: str | None = None
    starts = served = 0
    served_after = False
    for line in text.splitlines():
        found = STAMP.search(line)
        if found:
            stamp = found.group(1)
        if any(marker in line for marker in STARTING):
            starts += 1
        if SERVED in line:
            served += 1
            served_after = refusal is not None
        match = REFUSAL.search(line)
        if match:
            refusal, at, served_after = (int(match.group(1)), int(match.group(2))), stamp, False
    return LogReading(where, refusal, at, starts, served, served_after)


async def journal(unit: str) -> tuple[str | None, str | None]:
    """The unit's journal as text, or None and why not."""
    command = ["journalctl", "-u", unit, "--no-pager", "-o", "cat", "-n", str(JOURNAL_LINES)]
    try:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except FileNotFoundError:
        return None, "journalctl is not installed on this host (give vLLM's log file: --log FILE)"
    except OSError as exc:
        return None, f"journalctl could not run: {exc}"
    try:
        out, err = await asyncio.wait_for(process.communicate(), JOURNAL_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        return None, f"journalctl -u {unit} did not finish within {JOURNAL_TIMEOUT:.0f} s"
    said = " ".join(err.decode(errors="replace").split())[:300]
    if process.returncode != 0:
        return None, f"journalctl -u {unit} failed (exit {process.returncode}): {said or 'no message'}"
    text = out.decode(errors="replace")
    if not text.strip() or text.strip() == "-- No entries --":
        hint = f": {said}" if said else ""
        return None, (
            f"the journal has no entries for unit {unit} (no such unit, or none this user may read: "
            f"root or the systemd-journal group){hint}"
        )
    return text, None


def log_file(path: Path) -> tuple[str | None, str | None]:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL))
            return handle.read().decode(errors="replace"), None
    except OSError as exc:
        return None, f"cannot read the log file {path}: {exc.strerror or exc}"


@dataclass(frozen=True)
class CompatReading:
    target: str = ""
    draft: str = ""
    method: str = ""
    verdict: str | None = None  # "ok", "warning", "incompatible" over the vocabulary checks; None: not run
    checks: tuple[dict[str, Any], ...] = ()  # the vocabulary checks, as compat's --json gives them
    others: tuple[str, ...] = ()  # compat's other non-ok findings, one line each
    sizes: tuple[int | None, int | None] = (None, None)  # vocab_size of target and draft
    not_applicable: str | None = None  # why no vocabulary can mismatch (a method without a draft)
    problem: str | None = None  # why compat did not run


def _model(name: str, serving_file: Path) -> str:
    """A relative model path as the serving file's directory has it, when it is there."""
    beside = serving_file.parent / name
    return str(beside) if not Path(name).is_absolute() and beside.exists() else name


async def run_compat(serving_file: Path | None) -> CompatReading:
    from specguard.playbook.serve_config.serving import ServingError, load_serving

    if serving_file is None:
        return CompatReading(
            problem="no serving file (the config's `serving:`): the target and draft to compare"
        )
    try:
        serving = load_serving(serving_file)
    except ServingError as exc:
        return CompatReading(problem=f"the serving file cannot be read: {str(exc).splitlines()[0]}")
    if serving.draft is None:
        return CompatReading(serving.target, "", serving.method,
                             not_applicable=f"method {serving.method} has no draft model: no vocabulary to mismatch")  # fmt: skip
    target, draft = _model(serving.target, serving_file), _model(serving.draft, serving_file)
    if serving.method not in COMPAT_METHODS:
        return CompatReading(
            target, draft, serving.method, problem=f"compat does not check method {serving.method}"
        )
    from specguard.playbook.compat import loading, run, samples

    try:
        report = await asyncio.to_thread(
            run.compare, target, draft, samples.builtin_samples(), serving.method
        )
    except loading.MissingExtra as exc:
        return CompatReading(target, draft, serving.method, problem=f"compat cannot run: {exc}")
    except loading.InputError as exc:
        return CompatReading(target, draft, serving.method, problem=f"compat: {exc}")
    except (OSError, ValueError) as exc:  # a file transformers or tokenizers could not use
        return CompatReading(
            target, draft, serving.method, problem=f"compat failed: {type(exc).__name__}: {exc}"
        )
    deciding = [c for c in report.checks if c.area in VOCABULARY_AREAS or c.name == "vocab_size"]
    ranked = max((c.verdict for c in deciding), key=lambda v: v.rank, default=None)
    sizes = next(
        ((c.data.get("target"), c.data.get("draft")) for c in deciding if c.name == "vocab_size"),
        (None, None),
    )
    others = tuple(f"{c.area} {c.name}: {c.verdict.value}: {c.evidence}" for c in report.checks
                   if c not in deciding and c.verdict.value != "ok")  # fmt: skip
    checks = tuple({"area": c.area, "name": c.name, "verdict": c.verdict.value, "evidence": c.evidence,
                    "details": list(c.details)} for c in deciding)  # fmt: skip
    return CompatReading(
        target, draft, serving.method, ranked.value if ranked else "ok", checks, others, sizes
    )


async def judge(evidence: Evidence) -> Finding:
    readings: list[LogReading] = []
    missing: list[str] = []
    if evidence.unit is None and evidence.log_file is None:
        missing.append("no vLLM log to read (--unit UNIT for its journal, or --log FILE)")
    if evidence.unit is not None:
        text, problem = await journal(evidence.unit)
        _add(readings, missing, text, problem, f"journal of {evidence.unit}")
    if evidence.log_file is not None:
        text, problem = await asyncio.to_thread(log_file, evidence.log_file)
        _add(readings, missing, text, problem, f"log file {evidence.log_file}")
    compat = await run_compat(evidence.serving_file)
    if compat.problem:
        missing.append(compat.problem)
    return _finding(readings, compat, missing)


def _add(
    readings: list[LogReading], missing: list[str], text: str | None, problem: str | None, where: str
) -> None:
    if text is None:
        missing.append(problem or f"{where}: nothing read")
        return
    reading = read_log(text, where)
    readings.append(reading)
    if reading.refusal is None and not reading.served:
        missing.append(f"{where}: no vLLM start-up served and no vocabulary refusal in what was read")


def _finding(readings: Sequence[LogReading], compat: CompatReading, missing: list[str]) -> Finding:
    refused = [r for r in readings if r.refusal is not None and not r.served_after]
    earlier = [r for r in readings if r.refusal is not None and r.served_after]
    served = [r for r in readings if r.refusal is None and r.served]
    figures = _figures(readings, compat)
    details: dict[str, object] = {
        "logs": [r.__dict__ for r in readings],
        "compat": {k: v for k, v in compat.__dict__.items() if v not in (None, "", ())},
    }
    if earlier:
        details["earlier_refusals"] = [
            f"{r.where}: refused at {r.refused_at or 'an earlier start-up'} (target {r.refusal[0]}, draft "
            f"{r.refusal[1]}); a later start-up was served"
            for r in earlier
            if r.refusal is not None
        ]
    pair = f"target {compat.target}, draft {compat.draft}" if compat.draft else ""
    if refused or compat.verdict == "incompatible":
        parts = [f"vLLM refused to start: target vocab_size {r.refusal[0]}, draft {r.refusal[1]} ({r.where}"
                 f"{', ' + r.refused_at if r.refused_at else ''})" for r in refused if r.refusal]  # fmt: skip
        if compat.verdict == "incompatible":
            parts.append(f"compat calls the pair incompatible ({pair})")
        return Finding(CASE, TITLE, Verdict.CAUSE_FOUND, "; ".join(parts), figures, _remedy(compat, refused),
                       tuple(missing), details)  # fmt: skip
    if compat.verdict == "warning":
        said = "; ".join(c["evidence"] for c in compat.checks if c["verdict"] == "warning")
        return Finding(CASE, TITLE, Verdict.SUSPECT, f"compat warns about the pair's vocabulary: {said} ({pair})",
                       figures, (f"check the pair in full: specguard compat {_args(compat)}",), tuple(missing), details)  # fmt: skip
    if compat.verdict == "ok" or compat.not_applicable or served or earlier:
        lines: list[str] = []
        if served or earlier:
            lines.append("the last start-up was served, with no vocabulary refusal after it "
                        f"({', '.join(r.where for r in (*served, *earlier))})")  # fmt: skip
        if compat.verdict == "ok":
            lines.append(f"compat finds the vocabularies the same ({pair})")
        elif compat.not_applicable:
            lines.append(compat.not_applicable)
        return Finding(CASE, TITLE, Verdict.FINE, "; ".join(lines), figures, (), tuple(missing), details)
    return Finding(CASE, TITLE, Verdict.UNKNOWN, "no start-up log and no compat result to judge the vocabulary by",
                   figures, (), tuple(missing), details)  # fmt: skip


def _args(compat: CompatReading) -> str:
    method = f" --method {compat.method}" if compat.method and compat.method != "draft_model" else ""
    return f"{compat.target or 'TARGET'} {compat.draft or 'DRAFT'}{method}"


def _remedy(compat: CompatReading, refused: Sequence[LogReading]) -> tuple[str, ...]:
    steps = [
        "serve a draft with the target's vocabulary (the same tokenizer: a smaller model of the "
        f"target's family), and check the pair before a restart: specguard compat {_args(compat)}",
    ]
    if refused:
        steps.append("until then vLLM does not start with this speculative config: start it without one "
                     "(speculative decoding off), or send the traffic to the standard pool (the fallback flag)")  # fmt: skip
    if compat.method in ("", "draft_model"):
        steps.append('vLLM 0.25-0.33 only: "use_heterogeneous_vocab": true in the speculative config skips the '
                     "check, for method draft_model with greedy drafting only")  # fmt: skip
    wrong = [c for c in compat.checks if c["verdict"] == "incompatible"]
    wrong.sort(key=lambda c: c["name"] != "vocab_size")  # the size vLLM compares first
    steps += [f"compat: {c['name']}: {c['evidence']}" for c in wrong]
    return tuple(steps)


def _figures(readings: Sequence[LogReading], compat: CompatReading) -> tuple[Figure, ...]:
    out = []
    for r in readings:
        if r.refusal is not None:
            line = "vLLM refuses a draft_model whose vocab_size differs from the target's"
            out.append(Figure("target_vocab_size", r.refusal[0], "tokens", line, r.where, "refusal"))
            out.append(Figure("draft_vocab_size", r.refusal[1], "tokens", line, r.where, "refusal"))
        out.append(Figure("startups_served", r.served, "", f"of {r.starts} start-up(s) seen", r.where))
    if compat.verdict is not None:
        source = f"compat {_args(compat)}"
        out.append(
            Figure("compat_verdict", compat.verdict, "", "incompatible: cause; warning: suspect", source)
        )
        target, draft = compat.sizes
        if target is not None or draft is not None:
            out.append(
                Figure("target_vocab_size", target, "tokens", "equal to the draft's", source, "config.json")
            )
            out.append(
                Figure("draft_vocab_size", draft, "tokens", "equal to the target's", source, "config.json")
            )
    return tuple(out)
