"""Tiny tokenizers and configs for `specguard compat`, built with the tokenizers library and written
as transformers expects a model directory (tokenizer.json, tokenizer_config.json, config.json), with
deliberate differences between them. No weights: compat reads configs and tokenizers only (an
EAGLE-3 head's d2t/t2d excepted, written with safetensors)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
OTHER_TEMPLATE = (
    "{% for m in messages %}### {{ m['role'] | capitalize }}:\n{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}### Assistant:\n{% endif %}"
)
WORDS = ("the", "model", "draft", "target", "token", "tokens", "accept", "speculative", "decoding", "fast", "cache", "memory", "batch", "request", "latency", "server", "engine", "step", "position", "guess", "match", "sample", "greedy", "rate", "window", "rule", "alert", "quiet", "return", "def", "int", "for", "while", "print", "value", "sum")  # fmt: skip


def corpus() -> list[str]:
    lines = []
    for i in range(400):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(4 + i % 9)]
        line = " ".join(words)
        lines.append(line.capitalize() + (f" {i * 37 % 1000}." if i % 3 == 0 else "."))
        if i % 5 == 0:
            lines.append(f"def {words[0]}(x):\n    return x + {i % 10}")
    return lines


def byte_level(
    vocab_size: int, specials: list[str] = SPECIALS, trailing: list[str] | None = None
) -> Tokenizer:
    """A byte-level BPE (GPT-2 / Llama-3 style); ``trailing`` specials get ids after the trained ones."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    if trailing:
        bpe.add_special_tokens(trailing)
    return bpe


def sentencepiece_like(vocab_size: int) -> Tokenizer:
    """A Llama-2 style BPE: metaspace pre-tokenizer, byte fallback with <0x..> tokens."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    bpe.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    bpe.train_from_iterator(corpus(), trainer=trainer)
    return bpe


def tokenizer_json(tokenizer: Tokenizer) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(tokenizer.to_str())
    return parsed


def write(
    directory: Path,
    tokenizer: dict[str, Any] | None,
    *,
    bos: str | None = "<s>",
    eos: str = "</s>",
    pad: str | None = "<pad>",
    unk: str | None = "<unk>",
    chat_template: str | None = CHAT_TEMPLATE,
    config: dict[str, Any] | None = None,
) -> Path:
    """A model directory: tokenizer.json (a parsed tokenizer, possibly edited), its
    tokenizer_config.json and a Llama config.json (``config`` overrides keys)."""
    directory.mkdir(parents=True)
    vocab_size = None
    if tokenizer is not None:
        (directory / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
        settings: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "pad_token": pad,
            "unk_token": unk,
            "model_max_length": 1024,
            "clean_up_tokenization_spaces": False,
        }
        if chat_template is not None:
            settings["chat_template"] = chat_template
        (directory / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
        vocab_size = Tokenizer.from_str(json.dumps(tokenizer)).get_vocab_size(with_added_tokens=True)
    values: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
    values.update(config or {})
    (directory / "config.json").write_text(json.dumps(values), encoding="utf-8")
    return directory


def with_swapped_ids(tokenizer: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    """The same tokenizer with the ids of tokens ``a`` and ``b`` exchanged (same size, same merges)."""
    edited = copy.deepcopy(tokenizer)
    vocab = edited["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    return edited


def with_reversed_merges(tokenizer: dict[str, Any]) -> dict[str, Any]:
    """The same vocabulary with its merges in the reverse order: same size, other splits."""
    edited = copy.deepcopy(tokenizer)
    edited["model"]["merges"] = list(reversed(edited["model"]["merges"]))
    return edited


def with_normalizer(tokenizer: dict[str, Any], normalizer: normalizers.Normalizer) -> dict[str, Any]:
    edited = copy.deepcopy(tokenizer)
    probe = Tokenizer(models.BPE())
    probe.normalizer = normalizer
    edited["normalizer"] = tokenizer_json(probe)["normalizer"]
    return edited
