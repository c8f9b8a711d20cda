"""Token counts and token text without a tokenizer.

Prompt tokens are estimated as one token per 4 characters (rounded up), the usual rule of thumb
for English BPE vocabularies; a chat request adds 4 tokens per message for the chat template's
role markers and 3 for the assistant header the template appends. Deterministic, so tests and
operators can predict ``usage.prompt_tokens``.

Generated tokens are pseudo-word pieces drawn from a per-request RNG: readable, deterministic for a
given ``--seed``, and every token is non-empty text except the EOS token, which is "".
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_FOR_REPLY = 3

_PIECES = (
    "ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "an", "is", "qu", "el", "ba", "ri", "nu",
    "tes", "po", "gar", "lin", "ost", "em", "ur", "fa", "shi", "ton", "ve", "mar", "di", "ol", "cre",
)  # fmt: skip
_WORD_START = 0.45  # share of tokens that start a new word (with a leading space)


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def chat_prompt_tokens(message_texts: Iterable[str]) -> int:
    return sum(text_tokens(text) + CHAT_TOKENS_PER_MESSAGE for text in message_texts) + CHAT_TOKENS_FOR_REPLY


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
