"""The texts both tokenizers encode: a built-in set (English, CJK, code, emoji, numbers, whitespace
runs, and the multilingual prompts of the bench) and the user's ``--texts`` file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specguard.playbook.bench.prompts import PromptError, builtin, read_file


@dataclass(frozen=True)
class Sample:
    kind: str  # english, cjk, code, emoji, numbers, whitespace, multilingual, or "texts" (the file)
    text: str
    where: str  # how a message names it: "builtin:code #2", "texts.txt:14"


BUILTIN: tuple[tuple[str, str], ...] = (
    ("english", "The quick brown fox jumps over the lazy dog."),
    ("english", "Speculative decoding lets a small draft model propose tokens that the target verifies."),
    ("english", "Don't forget: it's 'quoted', \"double-quoted\" and (parenthesised) -- all right?"),
    ("cjk", "今天天气很好，我们去公园散步吧。"),  # noqa: RUF001 (the full-width comma is the point)
    ("cjk", "東京駅から新幹線で京都まで約二時間十五分かかります。"),
    ("cjk", "한국어 문장도 토크나이저가 올바르게 처리해야 합니다."),
    ("code", "def add(a: int, b: int) -> int:\n    return a + b\n"),
    ("code", "for (int i = 0; i < n; ++i) {\n\tsum += v[i] * w[i];\n}"),
    ("code", '{"model": "draft", "num_speculative_tokens": 4, "method": "draft_model"}'),
    ("code", "SELECT id, name FROM users WHERE created_at >= '2024-01-01' ORDER BY id;"),
    ("emoji", "Great job 🎉🎉 see you soon 👋🏽 — 🇫🇷 🧑‍💻"),
    ("numbers", "3.14159 2718281828 1,000,000 -42 0x1F 1e-9 12:30 2024-06-01"),
    ("numbers", "Order #48213 costs $1,299.99 (incl. 19% VAT); call +1 (555) 010-9999."),
    ("whitespace", "two  spaces,   three,    four\tand a tab\t\tand two"),
    ("whitespace", "\n\nleading newlines, trailing spaces   \n"),
    ("whitespace", "        indented eight\n            indented twelve"),
)
MULTILINGUAL_PROMPTS = 8  # the first prompts of the bench's multilingual set (several languages)


def builtin_samples() -> list[Sample]:
    counters: dict[str, int] = {}
    samples = []
    for kind, text in BUILTIN:
        counters[kind] = counters.get(kind, 0) + 1
        samples.append(Sample(kind, text, f"builtin:{kind} #{counters[kind]}"))
    prompts = builtin(["multilingual"])[:MULTILINGUAL_PROMPTS]
    samples.extend(
        Sample("multilingual", p.text, f"builtin:multilingual #{i}") for i, p in enumerate(prompts, 1)
    )
    return samples


class TextsError(ValueError):
    """A ``--texts`` file that cannot be used: ``file[:line]: message``."""


def read_texts(path: Path) -> list[Sample]:
    """The samples of a ``--texts`` file. ``.jsonl`` and ``.json`` files are read as the bench reads
    prompt files (JSONL lines with a "prompt" field, or ShareGPT JSON); any other file is UTF-8
    text, one sample per non-blank line."""
    if path.suffix.lower() in {".jsonl", ".json"}:
        try:
            found = read_file(path)
        except PromptError as err:
            raise TextsError(str(err)) from None
        return [Sample("texts", p.text, f"{path}:#{i}") for i, p in enumerate(found.prompts, 1)]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TextsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TextsError(f"{path}: is a directory, not a file of texts") from None
    except OSError as err:
        raise TextsError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise TextsError(f"{path}:{line}: not UTF-8 text (byte {err.start})") from None
    samples = [
        Sample("texts", line, f"{path}:{number}")
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]
    if not samples:
        raise TextsError(f"{path}: no texts: the file has no non-blank line")
    return samples
