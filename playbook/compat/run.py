"""The whole comparison: load both models, tell the kind of draft, run the checks that apply."""

from __future__ import annotations

from collections.abc import Sequence

from specguard.playbook.compat import chat, config_checks, heads, loading
from specguard.playbook.compat import tokenizer_checks as tok
from specguard.playbook.compat.method import HEADS, detect
from specguard.playbook.compat.samples import Sample
from specguard.playbook.compat.verdicts import Check, ModelInfo, Report, Verdict


def compare(
    target_name: str,
    draft_name: str,
    samples: Sequence[Sample],
    method: str | None = None,
    allow_download: bool = False,
) -> Report:
    """Raises loading.MissingExtra without transformers, loading.InputError for a model it cannot use."""
    target = loading.load("target", target_name, allow_download)
    draft = loading.load("draft", draft_name, allow_download)
    if target.tokenizer is None:
        raise loading.InputError(
            f"target {target.path}: {target.tokenizer_note}; vLLM serves with the target's"
        )
    kind, told = detect(draft.raw, draft_name, method)
    checks = tokenizer_side(target, draft, kind, samples)
    checks += [config_checks.vocab_size(target, draft, kind)]
    if kind in HEADS:
        checks.append(heads.reduced_vocabulary(target, draft))
    checks += [config_checks.positions(target, draft), config_checks.rope(target, draft, kind)]
    return Report(_info(target), _info(draft), kind, told, tuple(checks))


def tokenizer_side(
    target: loading.Model, draft: loading.Model, kind: str, samples: Sequence[Sample]
) -> list[Check]:
    t, d = target.tokenizer, draft.tokenizer
    if d is None:
        if kind == "draft_model":
            return [Check(tok.AREA, "tokenizer", Verdict.WARNING,
                          f"the draft has no tokenizer ({draft.tokenizer_note}): its token<->id map cannot be "
                          "checked, only its config's vocab_size")]  # fmt: skip
        return [Check(tok.AREA, "tokenizer", Verdict.OK,
                      f"the {kind} draft has no tokenizer of its own: vLLM runs it on the target's ids "
                      "(checked instead: vocab_size and the head's draft vocabulary)")]  # fmt: skip
    tb, db = tok.backend(t), tok.backend(d)
    return [
        tok.vocabulary(t, d),
        tok.model(tb, db),
        tok.specials(t, d),
        tok.added(t, d),
        tok.component("normalizer", "normalizer", tb, db),
        tok.component("pre_tokenizer", "pre-tokenizer", tb, db),
        tok.encodings(t, d, samples),
        tok.round_trips(t, d, samples),
        chat.rendering(t, d),
        chat.template_tokens(t, d),
    ]


def _info(model: loading.Model) -> ModelInfo:
    return ModelInfo(model.name, str(model.path), model.source)
