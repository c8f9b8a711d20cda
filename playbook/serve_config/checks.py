"""A serving file checked against one vLLM version: the speculative config that version accepts,
what it leaves out and why, and what it refuses (each refusal at its key's line)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specguard.common.names import did_you_mean
from specguard.common.yamlfile import Problem
from specguard.playbook.serve_config.serving import Serving, ServingError
from specguard.playbook.serve_config.versions import (
    KEYS,
    Version,
    covered,
    cpu_warnings,
    key_verdict,
    method_note,
    method_problem,
    newer_than_known,
    show,
)

SCHEDULE = "num_speculative_tokens_per_batch_size"


@dataclass(frozen=True)
class Plan:
    """What to render: the serving file, the version asked for and the one whose facts apply (the
    newest known, for a newer release), the speculative config, and the warnings."""

    serving: Serving
    version: Version
    facts: Version
    speculative: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def version_text(self) -> str:
        return show(self.version)


def plan(serving: Serving, version: Version) -> Plan:
    """The speculative config of ``serving`` for vLLM ``version``. Raises VersionError for a
    version before the table, ServingError (every problem, at its key's line) for what that version
    does not have or refuses."""
    facts = covered(version)
    errors: list[Problem] = []
    warnings: list[str] = []
    newer = newer_than_known(version)
    if newer:
        warnings.append(newer)

    why = method_problem(serving.method, facts)
    if why:
        errors.append(serving.problem("method", why))
    note = method_note(serving.method, facts)
    if note:
        warnings.append(note)

    config: dict[str, Any] = {"method": serving.method}
    if serving.draft is not None:
        config["model"] = serving.draft
    config["num_speculative_tokens"] = serving.num_speculative_tokens
    if serving.draft_tensor_parallel_size is not None:
        config["draft_tensor_parallel_size"] = serving.draft_tensor_parallel_size

    schedule = serving.num_speculative_tokens_per_batch_size
    if schedule is not None:
        verdict = key_verdict(SCHEDULE, facts)
        if verdict.status != "ok":
            errors.append(
                serving.problem(SCHEDULE, f"a k per batch size needs vLLM 0.25 or later: {verdict.reason}")
            )
        config[SCHEDULE] = [list(entry) for entry in schedule]
        over = [entry for entry in schedule if entry[2] > serving.num_speculative_tokens]
        if over:
            warnings.append(
                f"{SCHEDULE}: vLLM caps each range's k at num_speculative_tokens "
                f"({serving.num_speculative_tokens}); {', '.join(str(list(e)) for e in over)} ask for more"
            )

    for key, value in serving.speculative_extra.items():
        where = f"speculative_extra.{key}"
        verdict = key_verdict(key, facts)
        if verdict.status == "unknown":
            errors.append(serving.problem(where, f"{verdict.reason}{did_you_mean(key, KEYS)}"))
        elif verdict.status == "refused":
            errors.append(serving.problem(where, verdict.reason))
        elif verdict.status == "dropped":
            warnings.append(f"{where}: left out: {verdict.reason}")
        else:
            if verdict.reason:
                warnings.append(f"{where}: {verdict.reason}")
            config[key] = value

    if serving.device == "cpu":
        warnings.extend(f"device cpu: {line}" for line in cpu_warnings(serving.method, facts))
    if errors:
        raise ServingError(errors)
    return Plan(serving, version, facts, config, warnings)
