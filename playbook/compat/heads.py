"""EAGLE and EAGLE-3 heads with a reduced vocabulary. An EAGLE-3 head may draft over fewer tokens
than the target has (``draft_vocab_size`` in its config.json) and map each of its ids to a target
id through ``d2t`` in its weights: target id = draft id + d2t[draft id], as vLLM 0.32's
``Eagle3LlamaForCausalLM`` reads it (``t2d``, a mask over the target's ids, is not read by vLLM;
when present it must mark the same ids). Such a head is compatible; what must hold is checked here.
Without ``d2t`` vLLM leaves the map at zeros and every draft id i stands for target id i."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specguard.playbook.compat.loading import Model
from specguard.playbook.compat.verdicts import Check, Verdict

AREA = "draft head"
NAME = "draft vocabulary (d2t)"


def reduced_vocabulary(target: Model, draft: Model) -> Check:
    t_size = target.text_value("vocab_size")
    d_vocab = draft.text_value("vocab_size")
    reduced = draft.raw.get("draft_vocab_size", draft.text_value("draft_vocab_size"))
    size = reduced if reduced is not None else d_vocab
    data: dict[str, Any] = {"target_vocab_size": t_size, "draft_vocab_size": size}
    if not isinstance(t_size, int) or not isinstance(size, int):
        return Check(
            AREA, NAME, Verdict.WARNING, "vocab_size or draft_vocab_size missing: not checked", (), data
        )
    if size == t_size:
        return Check(AREA, NAME, Verdict.OK,
                     f"draft_vocab_size {size} = the target's vocab_size: the head drafts over the whole "
                     "vocabulary, no d2t map needed", (), data)  # fmt: skip
    if size > t_size:
        return Check(AREA, NAME, Verdict.INCOMPATIBLE,
                     f"draft_vocab_size {size} > the target's vocab_size {t_size}", (), data)  # fmt: skip
    tensors, where = _read(draft.weights, ("d2t", "t2d"))
    if "d2t" not in tensors:
        if not draft.weights:
            return Check(AREA, NAME, Verdict.WARNING,
                         f"draft_vocab_size {size} < target {t_size}, but no *.safetensors here to read d2t "
                         "from: the map is not checked", (), data)  # fmt: skip
        return Check(AREA, NAME, Verdict.INCOMPATIBLE,
                     f"draft_vocab_size {size} < target {t_size} and no d2t in {where}: vLLM maps draft "
                     "id i to target id i, other tokens", (), data)  # fmt: skip
    return _check_maps(tensors, size, t_size, target, data)


def _check_maps(
    tensors: dict[str, Any], size: int, t_size: int, target: Model, data: dict[str, Any]
) -> Check:
    import numpy as np

    d2t = np.asarray(tensors["d2t"]).reshape(-1).astype(np.int64)
    problems = []
    if d2t.shape[0] != size:
        problems.append(f"d2t has {d2t.shape[0]} entries, draft_vocab_size is {size}")
        mapped = np.zeros(0, dtype=np.int64)
    else:
        mapped = np.arange(size, dtype=np.int64) + d2t
        outside = int(np.sum((mapped < 0) | (mapped >= t_size)))
        if outside:
            problems.append(f"{outside} draft ids map outside the target's 0-{t_size - 1}")
        repeats = size - len(np.unique(mapped))
        if repeats:
            problems.append(f"{repeats} target ids are mapped to more than once")
    if "t2d" in tensors and not problems:
        t2d = np.asarray(tensors["t2d"]).reshape(-1).astype(bool)
        if t2d.shape[0] != t_size:
            problems.append(f"t2d has {t2d.shape[0]} entries, the target's vocab_size is {t_size}")
        elif int(t2d.sum()) != size or not bool(t2d[mapped].all()):
            problems.append(f"t2d marks {int(t2d.sum())} target ids, not the {size} d2t maps to")
    data = {**data, "d2t": int(d2t.shape[0]), "t2d": "t2d" in tensors}
    if problems:
        return Check(AREA, NAME, Verdict.INCOMPATIBLE, "; ".join(problems), (), data)
    checked = f"{size} draft ids map through d2t to distinct target ids in 0-{t_size - 1}"
    if "t2d" in tensors:
        checked += "; t2d marks the same ids"
    eos = getattr(target.tokenizer, "eos_token_id", None) if target.tokenizer is not None else None
    if isinstance(eos, int) and eos not in set(mapped.tolist()):
        data["eos_mapped"] = False
        return Check(AREA, NAME, Verdict.WARNING,
                     f"{checked}; but the target's eos ({eos}) is not among them: the head never drafts "
                     "the end of an answer", (), data)  # fmt: skip
    return Check(AREA, NAME, Verdict.OK,
                 f"reduced vocabulary, compatible: draft_vocab_size {size} < target {t_size}; {checked}",
                 (), data)  # fmt: skip


def _read(files: list[Path], names: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """The tensors named (last part of the key: ``d2t`` or ``model.d2t``) from safetensors files."""
    from safetensors import safe_open

    found: dict[str, Any] = {}
    for file in files:
        with safe_open(str(file), framework="numpy") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                last = key.rsplit(".", 1)[-1]
                if last in names and last not in found:
                    found[last] = handle.get_tensor(key)
    return found, ", ".join(f.name for f in files) or "no weights"
