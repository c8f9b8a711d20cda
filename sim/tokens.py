"""Tokens without a tokenizer: prompt token ids, and the text and log-probabilities of generated ones.

A prompt is cut into pieces of 4 characters, one token each (the usual rule of thumb for English BPE
vocabularies), and each piece gets a stable id, so two prompts that start with the same text start
with the same token ids and the prefix cache can find what they share. A chat request adds 4 tokens
per message for the chat template's role markers (the same ids for the same role) and 3 for the
assistant header the template appends. Deterministic, so tests and operators can predict
``usage.prompt_tokens``.

Generated tokens are pseudo-word pieces drawn from a per-request RNG: readable, deterministic for a
given ``--seed``, and every token is non-empty text except the EOS token, which is "". Their
log-probabilities come from the same RNG: the sampled token is the most likely one, and the
alternatives shown next to it are other pieces with lower log-probabilities.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 32_000

_PIECES = (
    "ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "an", "is", "qu", "el", "ba", "ri", "nu",
    "tes", "po", "gar", "lin", "ost", "em", "ur", "fa", "shi", "ton", "ve", "mar", "di", "ol", "cre",
)  # fmt: skip
_WORD_START = 0.45  # share of tokens that start a new word (with a leading space)


def _token_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % VOCAB_SIZE


def text_token_ids(text: str) -> list[int]:
    """One id per 4-character piece of ``text``."""
    return [_token_id(text[i : i + CHARS_PER_TOKEN]) for i in range(0, len(text), CHARS_PER_TOKEN)]


def chat_prompt_token_ids(messages: Iterable[tuple[str, str]]) -> list[int]:
    """The token ids of a chat template applied to ``(role, text)`` messages."""
    ids: list[int] = []
    for role, text in messages:
        ids += [_token_id("<|start|>"), _token_id(f"<|{role}|>"), _token_id("<|sep|>"), _token_id("\n")]
        ids += text_token_ids(text)
    ids += [_token_id("<|start|>"), _token_id("<|assistant|>"), _token_id("<|sep|>")]
    return ids


class TokenText:
    """The text of one response's tokens."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._count = 0

    def next(self) -> str:
        piece = self._rng.choice(_PIECES)
        starts_word = self._count == 0 or self._rng.random() < _WORD_START
        self._count += 1
        return (" " + piece) if starts_word else piece


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log-probability and the most likely alternatives (itself first)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


class Logprobs:
    """Log-probabilities for one response's tokens, drawn from its own RNG."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def of(self, token: str, top: int) -> TokenLogprob:
        """``token``'s log-probability and the ``top`` most likely tokens, ``token`` first."""
        logprob = -self._rng.uniform(0.01, 3.0)
        alternatives: list[tuple[str, float]] = [(token, logprob)] if top > 0 else []
        others = [piece for piece in _PIECES if piece != token.strip()]
        current = logprob
        for piece in self._rng.sample(others, min(max(top - 1, 0), len(others))):
            current -= self._rng.uniform(0.05, 1.5)
            alternatives.append((piece, current))
        return TokenLogprob(token, logprob, tuple(alternatives))
