"""The chat template: the same conversation rendered by both tokenizers' templates, and the tokens
of the target's template (``<|im_start|>`` and the like) read with the draft's vocabulary. vLLM
renders chats with the target's template; a draft tuned on another format accepts less on chat
traffic, and one whose vocabulary gives those tokens other ids reads them as other tokens."""

from __future__ import annotations

from typing import Any

from specguard.playbook.compat.verdicts import Check, Verdict

AREA = "chat template"
CONVERSATION: list[dict[str, str]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is speculative decoding?"},
    {"role": "assistant", "content": "A small model drafts tokens; the large one verifies them."},
    {"role": "user", "content": "Show me 2 + 2 in Python."},
]


def render(tokenizer: Any) -> tuple[str | None, str]:
    """The conversation as the template renders it (with the generation prompt), or None and why.
    A template that refuses a system turn is rendered without it."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None, "no chat template"
    error = ""
    for conversation in (CONVERSATION, CONVERSATION[1:]):
        try:
            text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except Exception as err:  # jinja2's errors, or the template's own raise_exception
            error = " ".join(str(err).split())[:200] or type(err).__name__
            continue
        return str(text), ""
    return None, f"the template fails: {error}"


def rendering(target: Any, draft: Any) -> Check:
    t, t_note = render(target)
    d, d_note = render(draft)
    data = {"target": t, "draft": d}
    if t is None and d is None:
        return Check(AREA, "rendering", Verdict.OK, f"target: {t_note}; draft: {d_note}", (), data)
    if t is None:
        return Check(AREA, "rendering", Verdict.OK,
                     f"target: {t_note} (vLLM serves chat with the target's template only); the draft has one",
                     (), data)  # fmt: skip
    if d is None:
        return Check(AREA, "rendering", Verdict.WARNING,
                     f"draft: {d_note}: it may never have seen the target's chat format", (), data)  # fmt: skip
    if t != d:
        at = next((i for i, (x, y) in enumerate(zip(t, d, strict=False)) if x != y), min(len(t), len(d)))
        return Check(AREA, "rendering", Verdict.WARNING,
                     f"the same conversation renders differently (first difference at character {at}): "
                     "the draft was tuned on another chat format",
                     (f"target: {t[max(0, at - 20):at + 40]!r}", f"draft:  {d[max(0, at - 20):at + 40]!r}"),
                     data)  # fmt: skip
    return Check(AREA, "rendering", Verdict.OK,
                 f"the same conversation renders the same ({len(t)} characters)", (), data)  # fmt: skip


def template_tokens(target: Any, draft: Any) -> Check:
    """The target's added tokens that its template writes, with their ids on both sides."""
    source = getattr(target, "chat_template", None)
    if not isinstance(source, str) or not source:
        return Check(AREA, "template tokens", Verdict.OK, "the target has no chat template")
    rendered, _ = render(target)
    dv: dict[str, int] = draft.get_vocab()
    used = sorted(
        (i, tok.content)
        for i, tok in target.added_tokens_decoder.items()
        if tok.content in source or (rendered is not None and tok.content in rendered)
    )
    rows = {content: {"target": i, "draft": dv.get(content)} for i, content in used}
    wrong = [
        f"{c!r}: target {i}, draft {'missing' if dv.get(c) is None else dv[c]}"
        for i, c in used
        if dv.get(c) != i
    ]
    if wrong:
        return Check(AREA, "template tokens", Verdict.INCOMPATIBLE,
                     f"{len(wrong)} of the {len(used)} tokens the target's template writes have other ids "
                     "in the draft (or none)", tuple(wrong[:3]), rows)  # fmt: skip
    if not used:
        return Check(
            AREA, "template tokens", Verdict.OK, "the target's template writes no added tokens", (), rows
        )
    names = ", ".join(f"{c!r} {i}" for i, c in used[:6]) + (", ..." if len(used) > 6 else "")
    return Check(AREA, "template tokens", Verdict.OK, f"the same ids in the draft: {names}", (), rows)
