"""diagnose case 4, vocabulary mismatch at start-up: vLLM 0.32.0's own start-up logs (captured from
the real server: the tiny Llama target with a draft of vocabulary 384, refused; and the target as its
own draft, served; the machine's paths replaced), read from a file and through journalctl; compat on
the serving file's pair, built here from tiny tokenizers (tests/compat_models.py)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Verdict
from specguard.playbook.diagnose.vocabulary import JOURNAL_LINES, judge, read_log
from tests import compat_models as cm
from tests.real import require_binary

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
REFUSED = FIXTURES / "vllm-0.32.0-startup-vocab-refused.log"
SERVED = FIXTURES / "vllm-0.32.0-startup-served.log"


def evidence(**given: object) -> Evidence:
    return Evidence("history", 1_796_000_000.0, 1_796_003_600.0, **given)  # type: ignore[arg-type]


def test_the_refusal_is_read_with_both_sizes_from_vllms_own_log() -> None:
    reading = read_log(REFUSED.read_text(), "log")
    assert reading.refusal == (512, 384)
    assert reading.refused_at == "12-05 18:23:47"  # the last vLLM line before the traceback
    assert (reading.starts, reading.served, reading.served_after) == (1, 0, False)


def test_a_served_start_up_has_no_refusal() -> None:
    reading = read_log(SERVED.read_text(), "log")
    assert reading.refusal is None
    assert (reading.starts, reading.served) == (1, 1)


async def test_a_refusal_followed_by_a_served_start_up_is_history_not_the_cause(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(REFUSED.read_text() + SERVED.read_text())
    found = await judge(evidence(log_file=log))
    assert found.verdict is Verdict.FINE
    assert found.details["earlier_refusals"] == [
        f"log file {log}: refused at 12-05 18:23:47 (target 512, draft 384); a later start-up was served"
    ]


async def test_the_last_start_up_refused_is_the_cause_with_its_sizes_and_the_remedy(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(SERVED.read_text() + REFUSED.read_text())
    found = await judge(evidence(log_file=log))
    assert found.verdict is Verdict.CAUSE_FOUND
    assert "target vocab_size 512, draft 384" in found.summary
    sizes = {(f.name, f.scope): f.value for f in found.figures}
    assert sizes[("target_vocab_size", "refusal")] == 512
    assert sizes[("draft_vocab_size", "refusal")] == 384
    assert any("specguard compat" in step for step in found.remedy)
    # no serving file: compat could not run, and the finding says so
    assert any("no serving file" in line for line in found.missing)


async def test_nothing_to_read_is_unknown_never_fine() -> None:
    found = await judge(evidence())
    assert found.verdict is Verdict.UNKNOWN
    assert any("--unit UNIT" in line for line in found.missing)
    assert any("no serving file" in line for line in found.missing)


async def test_an_unreadable_log_file_is_said(tmp_path: Path) -> None:
    found = await judge(evidence(log_file=tmp_path / "missing.log"))
    assert found.verdict is Verdict.UNKNOWN
    assert any("cannot read the log file" in line and "missing.log" in line for line in found.missing)


async def test_a_log_without_any_start_up_proves_nothing(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("(APIServer pid=1) INFO 12-05 18:24:38 [launcher.py:195] Route: /health, Methods: GET\n")
    found = await judge(evidence(log_file=log))
    assert found.verdict is Verdict.UNKNOWN
    assert any("no vLLM start-up served" in line for line in found.missing)


# --- the journal ------------------------------------------------------------------------------


def fake_journalctl(directory: Path, log: Path, argv_file: Path) -> None:
    """A journalctl on PATH that records its arguments and prints a captured log, as `-o cat` does."""
    script = directory / "journalctl"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(argv_file)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
        f"sys.stdout.write(open({str(log)!r}).read())\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


async def test_the_units_journal_is_read_without_a_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = tmp_path / "argv"
    fake_journalctl(tmp_path, REFUSED, argv)
    monkeypatch.setenv("PATH", str(tmp_path))
    found = await judge(evidence(unit="vllm; rm -rf /"))  # a unit name is one argument, never shell
    assert argv.read_text().split("\n") == [
        "-u",
        "vllm; rm -rf /",
        "--no-pager",
        "-o",
        "cat",
        "-n",
        str(JOURNAL_LINES),
    ]
    assert found.verdict is Verdict.CAUSE_FOUND
    assert "journal of vllm; rm -rf /" in found.summary


async def test_without_journalctl_the_finding_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no journalctl
    found = await judge(evidence(unit="vllm.service"))
    assert found.verdict is Verdict.UNKNOWN
    assert any("journalctl is not installed" in line for line in found.missing)


async def test_a_unit_the_journal_does_not_know_is_said() -> None:
    require_binary("journalctl", "systemd")  # .ci/run installs it: a skip there is a failure
    unit = "specguard-no-such-unit-4f1c.service"
    found = await judge(evidence(unit=unit))
    assert found.verdict is Verdict.UNKNOWN
    assert any(unit in line for line in found.missing)


# --- compat on the serving file's pair ----------------------------------------------------------


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pairs")
    base = cm.tokenizer_json(cm.byte_level(400))
    cm.write(root / "target", base)
    cm.write(root / "same", base)
    cm.write(root / "smaller", cm.tokenizer_json(cm.byte_level(380)))
    return root


def serving(root: Path, draft: str | None, method: str = "draft_model") -> Path:
    path = root / f"serving-{draft}-{method}.yaml"
    lines = ["target: ./target", f"method: {method}", "num_speculative_tokens: 3"]
    path.write_text("\n".join([*lines, *([f"draft: ./{draft}"] if draft else [])]) + "\n")
    return path


async def test_compat_on_the_served_pair_finds_the_vocabulary_mismatch(pairs: Path) -> None:
    found = await judge(evidence(serving_file=serving(pairs, "smaller")))
    assert found.verdict is Verdict.CAUSE_FOUND
    assert "compat calls the pair incompatible" in found.summary
    sizes = {(f.name, f.scope): f.value for f in found.figures}
    assert sizes[("target_vocab_size", "config.json")] == 400
    assert sizes[("draft_vocab_size", "config.json")] == 380
    compat_lines = [step for step in found.remedy if step.startswith("compat: ")]
    assert compat_lines[0].startswith("compat: vocab_size: target 400, draft 380")


async def test_a_matching_pair_and_a_served_start_up_are_fine(pairs: Path) -> None:
    found = await judge(evidence(serving_file=serving(pairs, "same"), log_file=SERVED))
    assert found.verdict is Verdict.FINE
    assert "compat finds the vocabularies the same" in found.summary
    assert found.missing == ()


async def test_a_method_without_a_draft_cannot_mismatch(pairs: Path) -> None:
    found = await judge(evidence(serving_file=serving(pairs, None, "ngram")))
    assert found.verdict is Verdict.FINE
    assert "method ngram has no draft model" in found.summary


async def test_without_transformers_compat_is_unknown_and_says_why(
    pairs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    found = await judge(evidence(serving_file=serving(pairs, "smaller")))
    assert found.verdict is Verdict.UNKNOWN
    assert any("needs transformers" in line and "specguard[playbook]" in line for line in found.missing)


async def test_a_broken_serving_file_is_said_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "serving.yaml"
    path.write_text("target: t\nmethod: draft_model\n")
    found = await judge(evidence(serving_file=path))
    assert found.verdict is Verdict.UNKNOWN
    assert any(
        line.startswith("the serving file cannot be read: ") and str(path) in line for line in found.missing
    )
