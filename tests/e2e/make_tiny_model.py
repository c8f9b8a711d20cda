"""Build a tiny Llama model and its tokenizer into a directory vLLM can serve, with no download.

Run under the interpreter that has vLLM (and so torch, transformers and tokenizers):

    .venv-vllm/bin/python tests/e2e/make_tiny_model.py OUT_DIR [VOCAB_SIZE]

The tokenizer is a byte-level BPE (vocabulary 512, or VOCAB_SIZE) trained on generated lines; the model is a
randomly initialised ``LlamaForCausalLM`` (hidden 256, 4 layers, 4 heads, 2 KV heads, about 2.6 M
parameters, bf16) with a fixed seed. Its output is gibberish, which is all a test of the serving path
and its metrics needs: served as its own draft, its greedy drafts are always accepted at temperature
0, and at temperature 1.5 the target samples from a nearly flat distribution and rarely agrees with
the draft.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
WORDS = (
    "the", "a", "draft", "model", "target", "token", "tokens", "accept", "accepted", "reject", "verify",
    "speculative", "decoding", "fast", "slow", "cache", "memory", "batch", "request", "latency", "server",
    "engine", "step", "position", "guess", "match", "sample", "greedy", "temperature", "rate", "window",
    "rule", "alert", "fire", "quiet", "one", "two", "three", "four", "five", "six", "seven", "eight",
    "nine", "ten",
)  # fmt: skip


def corpus(lines: int, rng: random.Random) -> list[str]:
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 9999)))
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return out


def build(out: Path, vocab_size: int = VOCAB_SIZE) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(SEED)
    torch.manual_seed(SEED)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(3000, rng), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=1024,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"tiny llama: {parameters} parameters, vocabulary {len(tokenizer)}, in {out}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR [VOCAB_SIZE]")
    build(Path(sys.argv[1]), *(int(v) for v in sys.argv[2:]))
