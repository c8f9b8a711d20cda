"""A serving host for `specguard tune`'s tests: the simulator as vLLM (tests/vllm_host.py, its
speculative config in vLLM's YAML, restarted by the supervisor), and a specguard daemon whose
vllm_restart action manages it, with a rule that names the action (what tune silences).

The simulator's truth is known: conditional acceptance per position ACCEPTANCE and the draft's
cost DRAFT_COST, so the expected speedup of each k is (1 + Σ_{i<k} p_i) / (1 + k c) with
p_i = a_0 ... a_i; TRUE_BEST is the best of SWEEP, by a clear margin (about 10 % over the next).

With BATCHED the simulator's decode turns compute-bound as batches grow (sim/model.py: a step
verifies running * (k + 1) tokens at VERIFY_COST of a step each, against the memory-bound
1 + BATCH_SLOWDOWN * (running - 1)), so the best k depends on the batch: true_batch_best gives it
at each of LEVELS."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specguard.store import tune_results
from specguard.store.database import opened
from specguard.store.tune_results import TuneResult
from tests.ports import free_port
from tests.processes import Daemon, specguard
from tests.vllm_host import Host

ACCEPTANCE = (0.9, 0.8, 0.6, 0.3, 0.2)
DRAFT_COST = 0.1
LADDER = [5, 4, 3, 1, 0]  # the simulator starts at k = 4 (tests/vllm_host.py), which the sweep leaves out
SWEEP = (1, 3, 5)
ORIGINAL = 4
# Output long enough that the last, cut-short draft step of each request weighs little (the model
# ignores it), and no early end of sequence; a prefill too fast to count, so that every step costs
# what the model says.
SIM = ("--step-time", "0.01", "--acceptance-by-position", ",".join(map(str, ACCEPTANCE)),
       "--draft-cost", str(DRAFT_COST), "--mean-output-tokens", "100000",
       "--prefill-tokens-per-step", "10000000", "--seed", "7")  # fmt: skip
RULES = """\
rules:
  - name: acceptance_critical
    signal: acceptance_rate
    window: 20s
    interval: 1s
    condition: "< 0.3"
    for: 2s
    severity: critical
    actions: [shrink]
"""


def true_speedup(k: int) -> float:
    p = [math.prod(ACCEPTANCE[: i + 1]) for i in range(k)]
    return (1 + sum(p)) / (1 + k * DRAFT_COST)


TRUE_BEST = max(SWEEP, key=true_speedup)

# The per-batch-size sweep: at 2 running every k of BATCH_SWEEP is memory-bound (k = 3 verifies
# 2 x 4 x 0.1 = 0.8 of a step's compute, under 1.01) and k = 3 is about 36 % faster than k = 1; at 8
# running the step is compute-bound (1.6 steps of compute at k = 1, 3.2 at k = 3) and k = 1 is about
# 28 % faster than k = 3. Batches at a concurrency's start and end hold fewer requests, but k = 3
# stays best up to 3 running and k = 1 from 4 on, so both margins hold.
# A step of 20 ms, twice SIM's: a starved simulator whose steps are late by their own CPU time (the
# same at every k, so it favours the k that takes fewer steps) would need over 40 ms a step to turn
# the order at 8 running (about 1 ms a step here under load).
VERIFY_COST = 0.1
BATCH_SLOWDOWN = 0.01
BATCHED = (
    "--verify-token-cost",
    str(VERIFY_COST),
    "--batch-slowdown",
    str(BATCH_SLOWDOWN),
    "--step-time",
    "0.02",
)
BATCH_SWEEP = (1, 3)
LEVELS = (2, 8)


def true_step(k: int, running: int) -> float:
    """One decode step with BATCHED, in target steps at batch 1 (sim.model.step_seconds)."""
    memory = 1 + BATCH_SLOWDOWN * (running - 1)
    compute = VERIFY_COST * running * (k + 1)
    return (1 + k * DRAFT_COST) * memory if compute <= memory else compute + k * DRAFT_COST * memory


def true_acceptance_length(k: int) -> float:
    """Tokens a step makes at k: 1 + Σ_{i<k} p_i."""
    return 1 + sum(math.prod(ACCEPTANCE[: i + 1]) for i in range(k))


def true_batch_speedup(k: int, running: int) -> float:
    """Tokens per unit of time at k over plain decoding's, with ``running`` requests in each step."""
    return true_acceptance_length(k) / true_step(k, running) * true_step(0, running)


def true_batch_best(running: int) -> int:
    return max(BATCH_SWEEP, key=lambda k: true_batch_speedup(k, running))


class TuneHost:
    def __init__(
        self, tmp: Path, *, rules: str = RULES, action: bool = True, sim: Sequence[str] = ()
    ) -> None:
        self.root = tmp
        self.host = Host(tmp, "yaml", *SIM, *sim)
        self.port = free_port()
        (tmp / "rules.yaml").write_text(rules)
        actions = (
            {"shrink": {"type": "vllm_restart", "ladder": LADDER, "url": self.host.url,
                        "vllm_config": {"path": str(self.host.path)}, "command": self.host.command,
                        "status_command": self.host.status_command, "health_timeout": "30s"}}
            if action else {}
        )  # fmt: skip
        self.config = tmp / "specguard.yaml"
        self.config.write_text(
            json.dumps({
                "server": {"port": self.port}, "state_dir": "state", "interval": "1s", "rules": ["rules.yaml"],
                "sources": {"scrape": {"targets": [f"{self.host.url}/metrics"], "timeout": "5s"}},
                "actions": actions,
            })
        )  # fmt: skip
        self.daemon = Daemon(self.config, self.port, tmp / "specguard.log")
        self.serving = tmp / "serving.yaml"
        self.serving.write_text(
            "# serving.yaml for the simulator\n"
            'vllm_version: "0.32.0"\n'
            "target: tiny-llama   # the served model\n"
            "method: draft_model\n"
            "draft: tiny-draft\n"
            f"num_speculative_tokens: {ORIGINAL}   # k\n"
            "max_model_len: 8192\n"
        )

    def start(self) -> None:
        self.host.start()
        self.daemon.start()

    def stop(self) -> None:
        if self.daemon.process is not None and self.daemon.process.poll() is None:
            self.daemon.stop()
        self.host.stop()


# --- reading what `specguard tune` and the daemon say --------------------------------------------

ROW = re.compile(
    r"^(?P<klass>\w+)\s+(?P<k>\d+|off)\s+(?P<accept>[\d.-]+)\s+(?P<mal>[\d.-]+)\s+\S+\s+\S+\s+\S+\s+\S+\s+"
    r"(?P<measured>[\d.]+)x\s+(?:(?P<predicted>[\d.]+)x|-)$"
)


async def ready(host: TuneHost) -> None:
    await host.daemon.wait_for(lambda s: bool(s.get("rules")), timeout=60)


async def ladder(host: TuneHost) -> dict[str, Any]:
    code, out, err = await specguard("ladder", "show", "--config", str(host.config), "--format", "json")
    assert code == 0, err
    shown: dict[str, Any] = json.loads(out)[0]
    return shown


def rows(table: str) -> list[dict[str, str]]:
    return [m.groupdict() for line in table.splitlines() if (m := ROW.match(line))]


async def tune_kept(host: TuneHost) -> list[TuneResult]:
    async with opened(host.root / "state" / "specguard.db") as store:
        return await store.call(tune_results.latest, synced=False)


def sections(out: str) -> dict[int, list[dict[str, str]]]:
    """Each concurrency level's table rows (the lines between its heading and the next)."""
    found: dict[int, list[dict[str, str]]] = {}
    level = None
    for line in out.splitlines():
        if (m := re.match(r"^concurrency (\d+)$", line)) is not None:
            level = int(m.group(1))
            found[level] = []
        elif level is not None and (row := ROW.match(line)) is not None:
            found[level].append(row.groupdict())
    return found
