"""Which kind of draft it is: a whole model (vLLM's ``method: draft_model``), an EAGLE or EAGLE-3
head, or an MTP module. ``--method`` says so; otherwise the draft's config.json, then its name as
vLLM 0.32 reads it (``eagle3`` in the name is EAGLE-3, ``eagle-`` EAGLE), then ``draft_model``."""

from __future__ import annotations

from typing import Any

METHODS = ("draft_model", "eagle", "eagle3", "mtp")
HEADS = ("eagle", "eagle3")  # heads on the target's hidden states, possibly with a reduced vocabulary


def detect(raw: dict[str, Any], name: str, given: str | None) -> tuple[str, str]:
    """(method, how it was told)."""
    if given:
        return given, "--method"
    speculator = raw.get("speculators_model_type")
    if isinstance(speculator, str) and speculator.lower() in HEADS:
        return speculator.lower(), f"config.json speculators_model_type {speculator!r}"
    architectures = [str(a) for a in raw.get("architectures") or []]
    for arch in architectures:
        lowered = arch.lower()
        if "eagle3" in lowered:
            return "eagle3", f"config.json architectures {arch!r}"
        if "eagle" in lowered:
            return "eagle", f"config.json architectures {arch!r}"
    model_type = str(raw.get("model_type") or "")
    if model_type.lower().endswith("mtp"):
        return "mtp", f"config.json model_type {model_type!r}"
    if "draft_vocab_size" in raw:
        return "eagle3", "config.json has draft_vocab_size (an EAGLE-3 head's)"
    lowered = name.lower()
    if "eagle3" in lowered:
        return "eagle3", "'eagle3' in its name, as vLLM detects it"
    if "eagle-" in lowered:
        return "eagle", "'eagle-' in its name, as vLLM detects it"
    return "draft_model", "nothing says otherwise: a whole draft model (use --method if it is a head)"
