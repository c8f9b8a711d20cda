"""`specguard compat`: each deliberate difference between a target and a draft gets its verdict,
from tiny tokenizers and configs built here (tests/compat_models.py); the command's exit codes,
table and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import normalizers

from specguard.cli.entry import main
from tests import compat_models as cm

VOCAB = 400


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every model directory the tests compare, built once."""
    root = tmp_path_factory.mktemp("compat")
    base = cm.tokenizer_json(cm.byte_level(VOCAB))
    vocab = base["model"]["vocab"]
    llama3 = cm.byte_level(
        380, specials=["<unk>"], trailing=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    )
    made = {
        "target": cm.write(root / "target", base),
        "same": cm.write(root / "same", base),
        "smaller": cm.write(root / "smaller", cm.tokenizer_json(cm.byte_level(VOCAB - 20))),
        "swapped_ids": cm.write(root / "swapped_ids", cm.with_swapped_ids(base, "at", "in")),
        "reversed_merges": cm.write(root / "reversed_merges", cm.with_reversed_merges(base)),
        "other_eos": cm.write(root / "other_eos", base, eos="<|im_end|>"),
        "other_template": cm.write(root / "other_template", base, chat_template=cm.OTHER_TEMPLATE),
        "lowercase": cm.write(root / "lowercase", cm.with_normalizer(base, normalizers.Lowercase())),
        "llama2": cm.write(
            root / "llama2",
            cm.tokenizer_json(cm.sentencepiece_like(420)),
            pad=None,
            chat_template=None,
            config={"max_position_embeddings": 4096},
        ),
        "llama3": cm.write(
            root / "llama3",
            cm.tokenizer_json(llama3),
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            pad=None,
            unk=None,
            chat_template=None,
            config={
                "max_position_embeddings": 8192,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
                "rope_theta": 500000.0,
            },
        ),
        "short_context": cm.write(root / "short_context", base, config={"max_position_embeddings": 256}),
        "no_tokenizer": cm.write(root / "no_tokenizer", None, config={"vocab_size": len(vocab)}),
    }
    assert len(vocab) == VOCAB
    # An EAGLE-3 head drafting over 64 of the target's ids, the specials among them.
    chosen = np.array(sorted({0, 1, 2, 3, 4, 5, *range(40, 40 + 3 * 58, 3)}), dtype=np.int64)[:64]
    d2t = chosen - np.arange(64, dtype=np.int64)
    t2d = np.zeros(VOCAB, dtype=bool)
    t2d[chosen] = True
    head = {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": VOCAB, "draft_vocab_size": 64}
    made["eagle3"] = cm.write(root / "eagle3", None, config=head)
    save_file({"d2t": d2t, "t2d": t2d, "midlayer.hidden_norm.weight": np.ones(64, np.float32)},
              str(made["eagle3"] / "model.safetensors"))  # fmt: skip
    made["eagle3_no_d2t"] = cm.write(root / "eagle3_no_d2t", None, config=head)
    save_file({"t2d": t2d}, str(made["eagle3_no_d2t"] / "model.safetensors"))
    made["eagle3_bad_d2t"] = cm.write(root / "eagle3_bad_d2t", None, config=head)
    save_file({"d2t": d2t + VOCAB}, str(made["eagle3_bad_d2t"] / "model.safetensors"))
    made["eagle3_no_eos"] = cm.write(root / "eagle3_no_eos", None, config=head)
    away = np.arange(100, 164, dtype=np.int64) - np.arange(64, dtype=np.int64)
    save_file({"d2t": away}, str(made["eagle3_no_eos"] / "model.safetensors"))
    return made


def compat(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, dict[str, Any]]:
    code = main(["compat", *map(str, args), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in report["checks"]}


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_identical_pair_is_ok(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, report = compat(capsys, models["target"], models["same"])
    assert code == 0
    assert report["verdict"] == "ok"
    assert set(verdicts(report).values()) == {"ok"}
    assert report["method"] == "draft_model"
    encodings = check(report, "encodings")["data"]
    assert set(encodings["by_kind"]) == {
        "english",
        "cjk",
        "code",
        "emoji",
        "numbers",
        "whitespace",
        "multilingual",
    }


def test_other_vocab_size_is_what_vllm_refuses(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = compat(capsys, models["target"], models["smaller"])
    assert code == 2
    vocab = check(report, "vocab_size")
    assert vocab["verdict"] == "incompatible"
    assert vocab["data"] == {
        "target": VOCAB,
        "draft": VOCAB - 20,
        "method": "draft_model",
        "compared_by_vllm": True,
    }
    assert f"Target model vocab_size={VOCAB}. Draft model vocab_size={VOCAB - 20}." in vocab["details"][0]
    # Trained on the same text, the smaller vocabulary is the larger's first ids: the shared tokens
    # keep their ids, the merges past the smaller's last are missing.
    vocabulary = check(report, "vocabulary")
    assert (vocabulary["verdict"], vocabulary["data"]["only_target"]) == ("warning", 20)
    assert check(report, "model and merges")["verdict"] == "incompatible"


def test_same_size_with_swapped_ids_is_incompatible(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = compat(capsys, models["target"], models["swapped_ids"])
    assert code == 2
    found = verdicts(report)
    assert found["vocab_size"] == "ok"  # vLLM would start: the silent case
    assert found["vocabulary"] == "incompatible"
    assert check(report, "vocabulary")["data"]["other_id"] == 2
    assert found["decode round-trips"] == "incompatible"


def test_same_vocabulary_with_other_merges_is_incompatible(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = compat(capsys, models["target"], models["reversed_merges"])
    assert code == 2
    found = verdicts(report)
    assert found["vocab_size"] == "ok"
    assert found["vocabulary"] == "ok"  # the very same token<->id map
    assert found["model and merges"] == "incompatible"
    assert "another order" in check(report, "model and merges")["evidence"]
    assert found["encodings"] == "warning"
    assert check(report, "encodings")["data"]["differ"] > 0


def test_other_eos_is_a_warning(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, report = compat(capsys, models["target"], models["other_eos"])
    assert code == 1
    assert [name for name, v in verdicts(report).items() if v != "ok"] == ["special tokens"]
    eos = check(report, "special tokens")["data"]["eos"]
    assert eos["target"]["token"] == "</s>"
    assert eos["draft"]["token"] == "<|im_end|>"


def test_other_chat_template_is_a_warning(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = compat(capsys, models["target"], models["other_template"])
    assert code == 1
    assert [name for name, v in verdicts(report).items() if v != "ok"] == ["rendering"]
    rendering = check(report, "rendering")["data"]
    assert rendering["target"].startswith("<|im_start|>system\n")
    assert rendering["draft"].startswith("### System:\n")


def test_other_normalizer_is_a_warning(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("WHY IS THE DRAFT SLOW\n\nall lower case here\n", encoding="utf-8")
    code, report = compat(capsys, models["target"], models["lowercase"], "--texts", texts)
    assert code == 1
    found = verdicts(report)
    assert found["normalizer"] == "warning"
    assert found["encodings"] == "warning"
    assert found["decode round-trips"] == "warning"  # the draft's own round-trip loses the capitals
    assert "incompatible" not in found.values()
    assert check(report, "encodings")["data"]["by_kind"]["texts"] == {"samples": 2, "differ": 1}


def test_llama2_like_against_llama3_like(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, report = compat(capsys, models["llama3"], models["llama2"])
    assert code == 2
    found = verdicts(report)
    for name in ("vocab_size", "vocabulary", "model and merges"):
        assert found[name] == "incompatible", name
    for name in ("special tokens", "pre-tokenizer", "max positions", "rope"):
        assert found[name] == "warning", name
    sizes = check(report, "vocab_size")["data"]
    assert sizes["target"] != sizes["draft"]


def test_shorter_draft_context_is_a_warning(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = compat(capsys, models["target"], models["short_context"])
    assert code == 1
    assert check(report, "max positions")["data"] == {"target": 1024, "draft": 256}


def test_eagle3_head_with_reduced_vocabulary_is_compatible(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = compat(capsys, models["target"], models["eagle3"])
    assert code == 0, report
    assert report["method"] == "eagle3"
    assert "LlamaForCausalLMEagle3" in report["method_source"]
    head = check(report, "draft vocabulary (d2t)")
    assert head["verdict"] == "ok"
    assert head["data"]["draft_vocab_size"] == 64
    assert head["data"]["target_vocab_size"] == VOCAB
    assert head["data"]["t2d"] is True
    vocab = check(report, "vocab_size")
    assert vocab["verdict"] == "ok"
    assert vocab["data"]["compared_by_vllm"] is False


@pytest.mark.parametrize(
    ("head", "verdict", "said"),
    [
        ("eagle3_no_d2t", "incompatible", "no d2t"),
        ("eagle3_bad_d2t", "incompatible", "outside the target's"),
        ("eagle3_no_eos", "warning", "eos (2) is not among them"),
    ],
)
def test_eagle3_head_maps_are_checked(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], head: str, verdict: str, said: str
) -> None:
    code, report = compat(capsys, models["target"], models[head])
    assert code == {"warning": 1, "incompatible": 2}[verdict]
    found = check(report, "draft vocabulary (d2t)")
    assert found["verdict"] == verdict
    assert said in found["evidence"]


def test_method_says_what_the_config_does_not(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = compat(capsys, models["target"], models["no_tokenizer"])
    assert (code, report["method"], check(report, "tokenizer")["verdict"]) == (1, "draft_model", "warning")
    code, report = compat(capsys, models["target"], models["no_tokenizer"], "--method", "eagle3")
    assert (code, report["method"], report["method_source"]) == (0, "eagle3", "--method")
    assert check(report, "draft vocabulary (d2t)")["verdict"] == "ok"  # the whole vocabulary, no map


def test_table(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compat", str(models["target"]), str(models["smaller"])])
    out = capsys.readouterr().out
    assert code == 2
    lines = out.splitlines()
    assert (
        lines[2]
        == "method: draft_model (nothing says otherwise: a whole draft model (use --method if it is a head))"
    )
    header = next(line for line in lines if line.startswith("area"))
    assert header.split() == ["area", "check", "verdict", "evidence"]
    row = next(line for line in lines if line.startswith("config") and "vocab_size" in line)
    assert "INCOMPATIBLE" in row
    assert f"Target model vocab_size={VOCAB}. Draft model vocab_size={VOCAB - 20}." in out
    assert lines[-1].startswith("verdict: incompatible (") and lines[-1].endswith("exit 2")


def test_json_shape(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, report = compat(capsys, models["target"], models["other_eos"])
    assert set(report) == {"schema", "target", "draft", "method", "method_source", "verdict", "exit_code",
                           "counts", "checks"}  # fmt: skip
    assert report["schema"] == 1
    assert report["target"] == {
        "name": str(models["target"]),
        "path": str(models["target"]),
        "source": "local",
    }
    assert report["exit_code"] == code == 1
    assert report["counts"] == {"ok": len(report["checks"]) - 1, "warning": 1, "incompatible": 0}
    for entry in report["checks"]:
        assert set(entry) == {"area", "name", "verdict", "evidence", "details", "data"}
        assert entry["area"] in {"tokenizer", "chat template", "config", "draft head"}
        assert entry["verdict"] in {"ok", "warning", "incompatible"}
        assert isinstance(entry["evidence"], str) and entry["evidence"]
