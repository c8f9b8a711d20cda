"""`specguard compat` on input it cannot use: one line on stderr naming what and why, exit 2, no
report; models from a Hugging Face cache without downloading; without transformers, the extra to
install; and the daemon's and the command line's imports never load transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specguard.cli.entry import main
from tests import compat_models as cm

PREFIX = "specguard compat: error: "
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cm.write(tmp_path_factory.mktemp("input") / "target", cm.tokenizer_json(cm.byte_level(400)))


def failure(capsys: pytest.CaptureFixture[str], *args: str | Path) -> str:
    """The one line a refused run prints; it prints no report and exits 2."""
    code = main(["compat", *map(str, args)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(PREFIX)
    return lines[0].removeprefix(PREFIX)


def test_a_file_is_not_a_model(target: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = target / "config.json"
    assert (
        failure(capsys, target, file)
        == f"draft {file}: not a model directory (a model is a directory with a config.json)"
    )


def test_a_directory_without_config(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        failure(capsys, tmp_path, target) == f"target {tmp_path}: not a model directory: no config.json in it"
    )


def test_missing_directory(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    message = failure(capsys, target, missing)
    assert message == f"draft {missing}: no such directory (and not a hub id of the form org/name)"


def test_unreadable_config(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").mkdir()  # root reads any file: a directory in its place cannot be read
    assert failure(capsys, target, broken).startswith(f"draft {broken}/config.json: cannot read: ")


def test_config_not_json(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{\n  "vocab_size": 400,\n  oops\n}\n', encoding="utf-8")
    assert failure(capsys, target, broken).startswith(f"draft {broken}/config.json:3: not valid JSON: ")


def test_broken_tokenizer(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = cm.write(tmp_path / "broken", cm.tokenizer_json(cm.byte_level(400)))
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")
    assert failure(capsys, target, broken).startswith(f"draft {broken}: cannot load its tokenizer: ")


def test_target_without_tokenizer(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = cm.write(tmp_path / "bare", None, config={"vocab_size": 400})
    assert failure(capsys, bare, target) == (
        f"target {bare}: no tokenizer files in the directory; vLLM serves with the target's"
    )


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, ": no such file"),
        (b"", ": no texts: the file has no non-blank line"),
        (b"fine\n\nsecond \xff line\n", ":3: not UTF-8 text (byte 13)"),
    ],
)
def test_bad_texts_file(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, said: str
) -> None:
    texts = tmp_path / "texts.txt"
    if content is not None:
        texts.write_bytes(content)
    assert failure(capsys, target, target, "--texts", texts) == f"--texts {texts}{said}"


def test_bad_jsonl_texts_file(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"prompt": "fine"}\n{"prompt": 3}\n', encoding="utf-8")
    assert failure(capsys, target, target, "--texts", texts).startswith(f"--texts {texts}:2: prompt: ")


def hub_cache(root: Path, repo: str, model: Path) -> Path:
    """A Hugging Face hub cache holding ``repo`` at one snapshot, as huggingface_hub lays it out."""
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in model.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40, encoding="utf-8")
    return snapshot


HUB_RUNS = """\
import contextlib, io, json, sys
from specguard.cli.entry import main
runs = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["compat", *args])
    runs.append({"code": code, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(runs))
"""


def test_hub_ids_from_the_local_cache_only(target: Path, tmp_path: Path) -> None:
    """huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported: a process of its own."""
    snapshot = hub_cache(tmp_path / "hub", "tiny-org/tiny-draft", target)
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
    }
    runs = [
        [str(target), "tiny-org/tiny-draft", "--json"],
        [str(target), "tiny-org/not-cached"],
        [str(target), "tiny-org/not-cached", "--allow-download"],
    ]
    done = subprocess.run([sys.executable, "-c", HUB_RUNS, json.dumps(runs)], env=env, capture_output=True,
                          text=True, check=True, timeout=120)  # fmt: skip
    cached, missing, forbidden = json.loads(done.stdout)
    assert cached["code"] == 0, cached["err"]
    assert json.loads(cached["out"])["draft"] == {
        "name": "tiny-org/tiny-draft",
        "path": str(snapshot),
        "source": "cache",
    }
    assert (missing["code"], missing["out"]) == (2, "")
    assert missing["err"] == (
        f"{PREFIX}draft tiny-org/not-cached: no such directory, and not in the local Hugging Face cache "
        "(HF_HOME / HF_HUB_CACHE); nothing is downloaded without --allow-download\n"
    )
    assert (forbidden["code"], forbidden["out"]) == (2, "")
    assert forbidden["err"] == (
        f"{PREFIX}draft tiny-org/not-cached: not in the local Hugging Face cache, and HF_HUB_OFFLINE forbids "
        "downloading it\n"
    )


def test_without_transformers_names_the_extra(
    target: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    message = failure(capsys, target, target)
    assert message == (
        "specguard compat needs transformers (and tokenizers), which the playbook extra installs: "
        "pip install 'specguard[playbook]'"
    )


def test_daemon_and_command_line_do_not_import_transformers() -> None:
    code = (
        "import sys\n"
        "import specguard.cli.entry, specguard.daemon.runtime\n"
        "specguard.cli.entry.build_parser()\n"
        "print(sorted(m for m in ('transformers', 'tokenizers', 'huggingface_hub') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"
