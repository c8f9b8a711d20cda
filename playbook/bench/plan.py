"""What a run sends: the prompts that fit the server's context with their output, grouped into
phases, and ``--num-prompts`` shared among them.

A prompt whose tokens and ``max_tokens`` exceed the server's ``max_model_len`` (from ``/v1/models``)
would be refused or cut short, and its class's figures would not compare with another run's: such
prompts are left out before the run, with one line saying so. Prompt tokens are counted by the
server itself (vLLM's ``POST /tokenize``, the chat template applied for ``--api chat``). Only a
class asked for by name that has no prompt left stops the run.

``--num-prompts`` counts requests in all, as ``vllm bench serve`` counts them, shared as evenly as
can be among the phases (the first ones take one more when it does not divide).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from specguard.playbook.bench.client import Api
from specguard.playbook.bench.prompts import Prompt

TOKENIZE_AT_ONCE = 8  # /tokenize requests in flight


class PlanError(Exception):
    """The run cannot be planned as asked; the message says why and what to change."""


@dataclass(frozen=True)
class Phase:
    klass: str
    prompts: tuple[Prompt, ...]
    requests: int | None  # measured requests; None with a duration


@dataclass(frozen=True)
class Plan:
    phases: tuple[Phase, ...]
    notes: tuple[str, ...] = ()  # one line each, for the operator
    left_out: dict[str, int] = field(default_factory=dict)  # prompts left out, by class

    @property
    def requests(self) -> int | None:
        """Measured requests per server, or None when phases run for a duration."""
        counts = [phase.requests for phase in self.phases]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` as evenly as can be, the first ones taking the remainder."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def plan(
    prompts: Sequence[Prompt],
    *,
    per_class: bool,
    num_prompts: int | None,
    duration: float | None,
    max_tokens: int,
    named: Sequence[str] = (),
    limit: int | None = None,
    counts: dict[str, int] | None = None,
    source: str = "",
) -> Plan:
    """The phases of a run. ``limit`` is the context length the prompts must fit (None: not known),
    ``counts`` each prompt text's tokens (None: not counted), ``named`` the classes asked for by
    name. Raises PlanError when a named class, or the whole run, has no prompt that fits, and when
    ``num_prompts`` cannot give every phase a request."""
    notes: list[str] = []
    left_out: dict[str, int] = {}
    kept = list(prompts)
    if limit is not None and counts is not None:
        kept = [p for p in prompts if counts[p.text] + (p.max_tokens or max_tokens) <= limit]
        if len(kept) < len(prompts):
            left_out, line = _left_out(prompts, kept, limit, max_tokens, counts)
            notes.append(line)
            for klass in named:
                if klass in left_out and not any(p.klass == klass for p in kept):
                    raise PlanError(_cannot_run(klass, prompts, limit, max_tokens, counts))
            if not kept:
                raise PlanError(
                    f"no prompt{' of ' + source if source else ''} fits max_model_len {limit} with "
                    f"--max-tokens {max_tokens}: lower --max-tokens or serve a longer context"
                )
    groups: dict[str, list[Prompt]] = {}
    for prompt in kept:
        groups.setdefault(prompt.klass if per_class else "all", []).append(prompt)
    if num_prompts is not None:
        if num_prompts < len(groups):
            raise PlanError(
                f"--num-prompts {num_prompts} counts requests in all, and {len(groups)} classes run "
                f"({', '.join(groups)}): give at least {len(groups)}, or fewer --classes"
            )
        counted: list[int | None] = list(shares(num_prompts, len(groups)))
    elif duration is not None:
        counted = [None] * len(groups)
    else:
        counted = [len(group) for group in groups.values()]
    phases = tuple(
        Phase(klass, tuple(group), n) for (klass, group), n in zip(groups.items(), counted, strict=True)
    )
    return Plan(phases, tuple(notes), left_out)


def _left_out(
    prompts: Sequence[Prompt], kept: Sequence[Prompt], limit: int, max_tokens: int, counts: dict[str, int]
) -> tuple[dict[str, int], str]:
    total: dict[str, int] = {}
    for prompt in prompts:
        total[prompt.klass] = total.get(prompt.klass, 0) + 1
    remaining: dict[str, int] = {}
    for prompt in kept:
        remaining[prompt.klass] = remaining.get(prompt.klass, 0) + 1
    left = {k: n - remaining.get(k, 0) for k, n in total.items() if n > remaining.get(k, 0)}
    parts = [
        f"{klass} ({'all ' + str(n) + ': not run' if n == total[klass] else f'{n} of {total[klass]}'})"
        for klass, n in left.items()
    ]
    line = (
        f"left out {sum(left.values())} prompt(s) that cannot fit max_model_len {limit} with their "
        f"output (--max-tokens {max_tokens}): {', '.join(parts)}"
    )
    return left, line


def _cannot_run(
    klass: str, prompts: Sequence[Prompt], limit: int, max_tokens: int, counts: dict[str, int]
) -> str:
    mine = [p for p in prompts if p.klass == klass]
    shortest = min(counts[p.text] for p in mine)
    return (
        f"class {klass} cannot run: none of its {len(mine)} prompts fits max_model_len {limit} with "
        f"--max-tokens {max_tokens} (the shortest has {shortest} prompt tokens); serve a longer "
        f"context (vLLM's --max-model-len), lower --max-tokens, or leave {klass} out of --classes"
    )


async def count_tokens(
    session: aiohttp.ClientSession, url: str, model: str, api: Api, texts: Sequence[str]
) -> dict[str, int] | str:
    """Each text's prompt tokens, as the server counts them (``POST /tokenize``), or why they
    cannot be had (a server without the endpoint, an answer that is not vLLM's)."""
    gate = asyncio.Semaphore(TOKENIZE_AT_ONCE)
    distinct = list(dict.fromkeys(texts))

    async def one(text: str) -> int | str:
        body: dict[str, Any] = {"model": model}
        if api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        async with gate:
            try:
                async with session.post(
                    url + "/tokenize", json=body, timeout=aiohttp.ClientTimeout(total=30)
                ) as answer:
                    if answer.status in (404, 405):
                        return f"{url} has no /tokenize"
                    if answer.status != 200:
                        return f"{url}/tokenize answered HTTP {answer.status}"
                    data = await answer.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                return f"{url}/tokenize: {type(exc).__name__}: {exc}"
        count = data.get("count") if isinstance(data, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return f"{url}/tokenize gave no token count"
        return count

    answers = await asyncio.gather(*(one(text) for text in distinct))
    for answer in answers:
        if isinstance(answer, str):
            return answer
    return {text: int(n) for text, n in zip(distinct, answers, strict=True)}
