"""The tokenizers side by side. vLLM tokenizes with the target's tokenizer only and hands its ids to
the draft, so every id must mean to the draft what it means to the target (the vocabulary, the
merges), and the draft must have learnt on the same splits of the same text (normalizer,
pre-tokenizer, encodings) for its guesses to be accepted."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from specguard.playbook.compat.samples import Sample
from specguard.playbook.compat.verdicts import Check, Verdict

AREA = "tokenizer"
EXAMPLES = 3
SPECIALS = ("bos", "eos", "pad", "unk")


def backend(tokenizer: Any) -> dict[str, Any] | None:
    """The tokenizer's ``tokenizer.json`` as the tokenizers library holds it; None for a slow one."""
    inner = getattr(tokenizer, "backend_tokenizer", None)
    if inner is None:
        return None
    parsed: dict[str, Any] = json.loads(inner.to_str())
    return parsed


def vocabulary(target: Any, draft: Any) -> Check:
    tv: dict[str, int] = target.get_vocab()
    dv: dict[str, int] = draft.get_vocab()
    shared = tv.keys() & dv.keys()
    moved = sorted((tv[t], t) for t in shared if tv[t] != dv[t])
    only_t = sorted(tv[t] for t in tv.keys() - dv.keys())
    only_d = sorted(dv[t] for t in dv.keys() - tv.keys())
    data = {"target_size": len(tv), "draft_size": len(dv), "shared": len(shared), "other_id": len(moved),
            "only_target": len(only_t), "only_draft": len(only_d)}  # fmt: skip
    sizes = f"target {len(tv)} tokens, draft {len(dv)}"
    if moved:
        examples = tuple(f"{tok!r}: target id {tid}, draft id {dv[tok]}" for tid, tok in moved[:EXAMPLES])
        return Check(AREA, "vocabulary", Verdict.INCOMPATIBLE,
                     f"{sizes}; {len(moved)} of {len(shared)} shared tokens have other ids: "
                     "the draft reads the target's ids as other tokens", examples, data)  # fmt: skip
    if only_t or only_d:
        parts = []
        if only_t:
            parts.append(f"{len(only_t)} only in the target (ids {_span(only_t)})")
        if only_d:
            parts.append(f"{len(only_d)} only in the draft (ids {_span(only_d)})")
        return Check(AREA, "vocabulary", Verdict.WARNING,
                     f"{sizes}; the {len(shared)} shared tokens have the same ids; " + ", ".join(parts),
                     (), data)  # fmt: skip
    return Check(AREA, "vocabulary", Verdict.OK, f"{sizes}: the same token<->id map", (), data)


def model(target: dict[str, Any] | None, draft: dict[str, Any] | None) -> Check:
    """The tokenizer model: its type, the BPE merges in order (the same vocabulary with other merges
    splits the same text into other tokens), byte fallback and the like."""
    if target is None or draft is None:
        return Check(
            AREA, "model and merges", Verdict.OK, "not compared: a slow tokenizer has no tokenizer.json"
        )
    tm, dm = target.get("model", {}), draft.get("model", {})
    if tm.get("type") != dm.get("type"):
        return Check(AREA, "model and merges", Verdict.INCOMPATIBLE,
                     f"target {tm.get('type')}, draft {dm.get('type')}: other tokenizer models",
                     (), {"target_type": tm.get("type"), "draft_type": dm.get("type")})  # fmt: skip
    tmerges, dmerges = _merges(tm), _merges(dm)
    data: dict[str, Any] = {
        "type": tm.get("type"),
        "target_merges": len(tmerges),
        "draft_merges": len(dmerges),
    }
    if tmerges != dmerges:
        if sorted(tmerges) == sorted(dmerges):
            first = next(i for i, (a, b) in enumerate(zip(tmerges, dmerges, strict=True)) if a != b)
            moved = sum(1 for a, b in zip(tmerges, dmerges, strict=True) if a != b)
            return Check(AREA, "model and merges", Verdict.INCOMPATIBLE,
                         f"the same {len(tmerges)} merges in another order ({moved} ranks differ, the first "
                         f"at rank {first}): the same text splits into other tokens",
                         (f"rank {first}: target {tmerges[first]!r}, draft {dmerges[first]!r}",),
                         {**data, "reordered": moved})  # fmt: skip
        tset, dset = set(tmerges), set(dmerges)
        only_t = [m for m in tmerges if m not in dset]
        only_d = [m for m in dmerges if m not in tset]
        return Check(AREA, "model and merges", Verdict.INCOMPATIBLE,
                     f"other merges: {len(only_t)} only in the target, {len(only_d)} only in the draft",
                     tuple(f"target only: {m!r}" for m in only_t[:EXAMPLES]),
                     {**data, "only_target": len(only_t), "only_draft": len(only_d)})  # fmt: skip
    options = ("byte_fallback", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk")
    other = [f"{k}: target {tm.get(k)!r}, draft {dm.get(k)!r}" for k in options if tm.get(k) != dm.get(k)]
    if other:
        return Check(AREA, "model and merges", Verdict.WARNING,
                     f"{tm.get('type')}, the same merges; other options: " + "; ".join(other), (), data)  # fmt: skip
    what = f"the same {len(tmerges)} merges in the same order" if tmerges else "no merges"
    return Check(AREA, "model and merges", Verdict.OK, f"{tm.get('type')}, {what}", (), data)


def specials(target: Any, draft: Any) -> Check:
    rows: dict[str, Any] = {}
    differ = []
    for name in SPECIALS:
        t = (getattr(target, f"{name}_token", None), getattr(target, f"{name}_token_id", None))
        d = (getattr(draft, f"{name}_token", None), getattr(draft, f"{name}_token_id", None))
        rows[name] = {"target": {"token": t[0], "id": t[1]}, "draft": {"token": d[0], "id": d[1]}}
        if t != d:
            differ.append(f"{name}: target {_token(t)}, draft {_token(d)}")
    if differ:
        return Check(AREA, "special tokens", Verdict.WARNING,
                     "; ".join(differ) + " (vLLM stops on the target's; a draft that learnt another end "
                     "token is rejected where the target ends)", (), rows)  # fmt: skip
    same = ", ".join(f"{n} {_token((rows[n]['target']['token'], rows[n]['target']['id']))}" for n in SPECIALS)
    return Check(AREA, "special tokens", Verdict.OK, f"the same: {same}", (), rows)


def added(target: Any, draft: Any) -> Check:
    ta = {i: (t.content, bool(t.special)) for i, t in target.added_tokens_decoder.items()}
    da = {i: (t.content, bool(t.special)) for i, t in draft.added_tokens_decoder.items()}
    differ = sorted(i for i in ta.keys() | da.keys() if ta.get(i) != da.get(i))
    data = {"target": len(ta), "draft": len(da), "differ": len(differ)}
    if differ:
        examples = tuple(
            f"id {i}: target {_added(ta.get(i))}, draft {_added(da.get(i))}" for i in differ[:EXAMPLES]
        )
        return Check(AREA, "added tokens", Verdict.WARNING,
                     f"{len(differ)} of the added tokens differ (target {len(ta)}, draft {len(da)})",
                     examples, data)  # fmt: skip
    return Check(AREA, "added tokens", Verdict.OK, f"the same {len(ta)} added tokens", (), data)


def component(key: str, name: str, target: dict[str, Any] | None, draft: dict[str, Any] | None) -> Check:
    """The normalizer or the pre-tokenizer: the same text must reach the model the same way."""
    if target is None or draft is None:
        return Check(AREA, name, Verdict.OK, "not compared: a slow tokenizer has no tokenizer.json")
    t, d = target.get(key), draft.get(key)
    if t != d:
        return Check(AREA, name, Verdict.WARNING,
                     f"differ: target {_short(t)}, draft {_short(d)} (the draft learnt on text prepared "
                     "otherwise; the encodings below show where it matters)",
                     (), {"target": t, "draft": d})  # fmt: skip
    return Check(AREA, name, Verdict.OK, f"the same: {_short(t)}", (), {"value": t})


def encodings(target: Any, draft: Any, samples: Sequence[Sample]) -> Check:
    """Each sample encoded by both (no special tokens added)."""
    differ: list[tuple[Sample, list[int], list[int]]] = []
    for sample in samples:
        a = target.encode(sample.text, add_special_tokens=False)
        b = draft.encode(sample.text, add_special_tokens=False)
        if a != b:
            differ.append((sample, a, b))
    kinds = Counter(s.kind for s in samples)
    bad = Counter(s.kind for s, _, _ in differ)
    by_kind = {k: {"samples": kinds[k], "differ": bad[k]} for k in kinds}
    data = {"samples": len(samples), "differ": len(differ), "by_kind": by_kind}
    if differ:
        summary = ", ".join(f"{k} {bad[k]}/{kinds[k]}" for k in kinds if bad[k])
        return Check(AREA, "encodings", Verdict.WARNING,
                     f"{len(differ)} of {len(samples)} samples encode differently ({summary}): the draft "
                     "learnt other token sequences for that text",
                     tuple(_first_difference(s, a, b) for s, a, b in differ[:EXAMPLES]), data)  # fmt: skip
    return Check(AREA, "encodings", Verdict.OK,
                 f"all {len(samples)} samples encode the same ({', '.join(kinds)})", (), data)  # fmt: skip


def round_trips(target: Any, draft: Any, samples: Sequence[Sample]) -> Check:
    """The target's ids decoded by the draft's tokenizer must give the target's text back (what the
    ids mean); and each tokenizer's own encode-decode, which may lose text (an unknown token)."""
    size = len(draft)
    crossed: list[str] = []
    lossy_t = lossy_d = 0
    for sample in samples:
        ids = target.encode(sample.text, add_special_tokens=False)
        back = _decode(target, ids)
        lossy_t += back != sample.text
        lossy_d += _decode(draft, draft.encode(sample.text, add_special_tokens=False)) != sample.text
        if any(i >= size for i in ids):
            crossed.append(f"{sample.where}: id {max(ids)} is past the draft's {size} tokens")
        elif (other := _decode(draft, ids)) != back:
            crossed.append(f"{sample.where}: target decodes {back[:40]!r}, draft {other[:40]!r}")
    data = {
        "samples": len(samples),
        "cross_differ": len(crossed),
        "target_lossy": lossy_t,
        "draft_lossy": lossy_d,
    }
    if crossed:
        return Check(AREA, "decode round-trips", Verdict.INCOMPATIBLE,
                     f"the target's ids decode to other text with the draft's tokenizer in {len(crossed)} "
                     f"of {len(samples)} samples", tuple(crossed[:EXAMPLES]), data)  # fmt: skip
    lossy = f"encode-decode loses text in {lossy_t} samples with the target's, {lossy_d} with the draft's"
    if lossy_d > lossy_t:
        return Check(AREA, "decode round-trips", Verdict.WARNING,
                     f"the target's ids decode the same with both; {lossy}", (), data)  # fmt: skip
    return Check(AREA, "decode round-trips", Verdict.OK,
                 f"the target's ids decode the same with both in all {len(samples)} samples; {lossy}",
                 (), data)  # fmt: skip


def _decode(tokenizer: Any, ids: list[int]) -> str:
    text: str = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return text


def _merges(model: dict[str, Any]) -> list[tuple[str, ...]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges") or []]


def _first_difference(sample: Sample, a: list[int], b: list[int]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (f"{sample.where}: {len(a)} vs {len(b)} tokens, first difference at token {at}: "
            f"target {a[at:at + 4]}, draft {b[at:at + 4]}")  # fmt: skip


def _span(ids: list[int]) -> str:
    return str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}"


def _token(pair: tuple[Any, Any]) -> str:
    return "none" if pair[0] is None else f"{pair[0]!r} ({pair[1]})"


def _added(entry: tuple[str, bool] | None) -> str:
    return "none" if entry is None else f"{entry[0]!r}" + (" special" if entry[1] else "")


def _short(value: Any, limit: int = 120) -> str:
    text = "none" if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."
