"""A real vLLM 0.32.0 /metrics page, and the same page as a busy server moves it forward."""

from __future__ import annotations

import re
from pathlib import Path

CAPTURE = Path(__file__).parents[1] / "tests" / "fixtures" / "vllm-0.32.0-cpu-metrics-self-draft.prom"
SAMPLE = re.compile(r"^([^\s{#]+)(\{.*\})? (\S+)$")


def grown(text: str, step: int) -> str:
    """The page after ``step`` scrapes of a busy server: every counter and bucket moved forward."""
    out = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not match[1].endswith("_created"):
            line = f"{line[: match.start(3)]}{float(match[3]) + step * 7.0!r}"
        out.append(line)
    return "\n".join(out) + "\n"
