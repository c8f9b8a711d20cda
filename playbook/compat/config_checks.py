"""The models' config.json side by side, read as vLLM reads it: the text config
(``get_text_config()`` where the model nests one), its ``vocab_size``, its positions and its
rotary embedding."""

from __future__ import annotations

from typing import Any

from specguard.playbook.compat.loading import Model
from specguard.playbook.compat.method import HEADS
from specguard.playbook.compat.verdicts import Check, Verdict

AREA = "config"
POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def vllm_refusal(target: int, draft: int) -> str:
    """vLLM 0.32's message (``SpeculativeConfig.verify_equal_vocab_size_if_draft_model``)."""
    return (
        "Target and draft model should have the same vocabulary size. "
        f"Target model vocab_size={target}. Draft model vocab_size={draft}. "
        "Using models with different tokenizers can cause out-of-bounds errors during speculative decoding."
    )


def vocab_size(target: Model, draft: Model, method: str) -> Check:
    """vLLM (0.15 and later) compares the text configs' ``vocab_size`` for ``method: draft_model``
    only, and refuses to start when they differ (unless ``use_heterogeneous_vocab``, 0.25-0.33, with
    greedy drafting). EAGLE heads and MTP modules are not compared there; a head's ``vocab_size``
    is the size of the target's logits it writes into, so it must be the target's all the same."""
    t, d = target.text_value("vocab_size"), draft.text_value("vocab_size")
    data = {"target": t, "draft": d, "method": method, "compared_by_vllm": method == "draft_model"}
    if t is None or d is None:
        missing = "target" if t is None else "draft"
        return Check(
            AREA, "vocab_size", Verdict.WARNING, f"the {missing}'s config.json has no vocab_size", (), data
        )
    if method == "draft_model":
        if t != d:
            return Check(AREA, "vocab_size", Verdict.INCOMPATIBLE,
                         f"target {t}, draft {d}: vLLM refuses to start (method draft_model)",
                         (f"vLLM 0.15+: ValueError: {vllm_refusal(t, d)}",
                          "vLLM 0.25-0.33 skip this check with \"use_heterogeneous_vocab\": true "
                          "(greedy drafting only)"), data)  # fmt: skip
        return Check(AREA, "vocab_size", Verdict.OK,
                     f"target {t}, draft {d}: equal, as vLLM requires for draft_model", (), data)  # fmt: skip
    if t != d:
        return Check(AREA, "vocab_size", Verdict.INCOMPATIBLE,
                     f"target {t}, the {method} draft {d}: its logits do not cover the target's vocabulary "
                     "(vLLM does not compare them for this method; the head fails or writes wrong ids)",
                     (), data)  # fmt: skip
    return Check(AREA, "vocab_size", Verdict.OK,
                 f"target {t}, {method} draft {d}: equal (vLLM does not compare them for {method})",
                 (), data)  # fmt: skip


def positions(target: Model, draft: Model) -> Check:
    t, d = target.text_value(*POSITIONS), draft.text_value(*POSITIONS)
    data = {"target": t, "draft": d}
    if t is None or d is None:
        return Check(
            AREA, "max positions", Verdict.OK, f"target {t}, draft {d}: not stated on both sides", (), data
        )
    if isinstance(t, int) and isinstance(d, int) and d < t:
        return Check(AREA, "max positions", Verdict.WARNING,
                     f"draft {d} < target {t}: past position {d} the draft runs where it was never trained "
                     "(or vLLM caps the context at the draft's)", (), data)  # fmt: skip
    return Check(AREA, "max positions", Verdict.OK, f"target {t}, draft {d}", (), data)


def rope(target: Model, draft: Model, method: str) -> Check:
    t, d = _rope(target), _rope(draft)
    data = {"target": t, "draft": d}
    if t != d:
        other = sorted(k for k in t.keys() | d.keys() if t.get(k) != d.get(k))
        lines = tuple(f"{k}: target {t.get(k)!r}, draft {d.get(k)!r}" for k in other)
        why = (
            "the head reads the target's hidden states at other frequencies"
            if method in HEADS
            else ("positions are encoded otherwise: acceptance drops, most on long contexts")
        )
        return Check(AREA, "rope", Verdict.WARNING, f"differ in {', '.join(other)}: {why}", lines, data)
    return Check(AREA, "rope", Verdict.OK, f"the same: {_describe(t)}", (), data)


def _rope(model: Model) -> dict[str, Any]:
    """rope_theta and rope scaling as one mapping (transformers 5 keeps both in ``rope_parameters``,
    4.x has ``rope_theta`` and ``rope_scaling``)."""
    found: dict[str, Any] = {}
    theta = model.text_value("rope_theta")
    if theta is not None:
        found["rope_theta"] = float(theta)
    for key in ("rope_scaling", "rope_parameters"):
        value = model.text_value(key)
        if isinstance(value, dict):
            for k, v in value.items():
                found[k] = float(v) if k == "rope_theta" and v is not None else v
    if found.get("rope_type") == "default" and "type" not in found:
        found.pop("rope_type")  # the same as none given
    return found


def _describe(rope: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(rope.items())) or "none stated"
