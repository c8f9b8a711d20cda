"""`specguard diagnose` on a state database with recorded history: the verdicts, the JSON and the
exit codes; and every kind of bad input refused in one line with exit 2, nothing else printed. The
cases run in order, and one that fails is unknown with its error while the others still answer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from specguard.cli.entry import main
from specguard.playbook.diagnose import run
from specguard.playbook.diagnose.evidence import Evidence
from specguard.playbook.diagnose.finding import Finding, Verdict
from specguard.store.database import Store
from specguard.store.exposition import parse_exposition
from specguard.store.history import record
from tests.diagnose_parts import page


def config(tmp_path: Path, cost: float | None = 0.05) -> Path:
    lines = [f"state_dir: {tmp_path / 'state'}"]
    if cost is not None:
        baseline = tmp_path / "baseline.json"
        baseline.write_text(json.dumps({"version": 2, "measured_at": "2026-12-01T00:00:00Z",
                                        "entries": [{"speculative": {"draft_cost": cost}}]}))  # fmt: skip
        lines.append(f"baseline: {baseline}")
    path = tmp_path / "specguard.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def recorded(tmp_path: Path, alpha: float, kv: float) -> None:
    """Ten minutes of history: 3 positions, each accepted with ``alpha`` given the ones before."""
    now = time.time()
    scrapes = []
    for i in range(11):
        drafts = 1000.0 * i
        per_pos = [drafts * alpha ** (p + 1) for p in range(3)]
        scrapes.append(
            ("10.0.0.7:8000", now - 600 + 60 * i, parse_exposition(page(drafts, sum(per_pos), per_pos, kv)))
        )

    async def write() -> None:
        store = Store(tmp_path / "state" / "specguard.db")
        await store.open()
        await store.call(lambda db: record(db, scrapes))
        await store.close()

    asyncio.run(write())


def test_a_collapse_in_history_is_found_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorded(tmp_path, 0.15, 0.4)
    code = main(["diagnose", "--config", str(config(tmp_path)), "--since", "30m", "--case", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["exit_code"] == 1
    (case,) = out["cases"]
    assert case["number"] == 1 and case["verdict"] == "cause found"
    alpha = next(f["value"] for f in case["figures"] if f["name"] == "alpha_hat")
    assert alpha == pytest.approx(0.15)
    assert out["window"]["source"] == "history" and out["window"]["servers"] == [["10.0.0.7:8000", "llama"]]


def test_healthy_history_is_fine_exit_0_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recorded(tmp_path, 0.8, 0.4)
    code = main(["diagnose", "--config", str(config(tmp_path)), "--case", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1. Slower since speculation was enabled: FINE" in out and "alpha_hat" in out


def test_no_history_is_unknown_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "--config", str(config(tmp_path, cost=None)), "--case", "1", "3"])
    out = capsys.readouterr().out
    assert code == 3
    assert "1. Slower since speculation was enabled: UNKNOWN" in out and "3. Bursty streaming: UNKNOWN" in out
    assert "no state database" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "an hour"], "specguard diagnose: --since: "),
        (["--until", "yesterday"], "specguard diagnose: --until: 'yesterday' is not a date"),
        (["--scrape", "5s"], "specguard diagnose: --scrape: give 10s to 1h, not 5s"),
        (["--scrape", "60s", "--since", "1h"], "specguard diagnose: --scrape: a live window starts now"),
        (["--bench", "{tmp}/none.json"], "specguard diagnose: --bench {tmp}/none.json: No such file"),
        (["--log", "{tmp}/vllm.log"], "specguard diagnose: --log {tmp}/vllm.log: no such file"),
        (["--log", "{tmp}/vllm.log", "--unit", "vllm"], "specguard diagnose: --log and --unit: give one"),
        (["--prometheus"], "specguard diagnose: --prometheus: the config has no sources.prometheus"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = main(["diagnose", "--config", str(config(tmp_path)), *argv])
    captured = capsys.readouterr()
    assert code == 2 and not captured.out
    assert captured.err.startswith(message.replace("{tmp}", str(tmp_path))) and captured.err.count("\n") == 1


def test_a_bad_config_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "specguard.yaml"
    path.write_text("interval: soon\n")
    assert main(["diagnose", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert not captured.out and "specguard.yaml:1" in captured.err and "interval" in captured.err


def test_a_case_number_out_of_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["diagnose", "--case", "5"])
    assert exited.value.code == 2 and "--case" in capsys.readouterr().err


async def test_the_cases_run_in_order_and_a_failing_one_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []

    def judge_of(number: int) -> run.Judge:
        async def judge(evidence: Evidence) -> Finding:
            ran.append(number)
            if number == 2:
                raise RuntimeError("the routing section is gone")
            name, title = run.CASES[number][1:]
            return Finding(name, title, Verdict.CAUSE_FOUND if number == 4 else Verdict.FINE, "ok")

        return judge

    monkeypatch.setattr(run, "judge_of", judge_of)
    findings = await run.diagnose(Evidence("history", 0.0, 60.0), (4, 2, 1, 3))
    assert ran == [1, 2, 3, 4]
    assert [f.verdict for f in findings] == [Verdict.FINE, Verdict.UNKNOWN, Verdict.FINE, Verdict.CAUSE_FOUND]
    assert "RuntimeError: the routing section is gone" in findings[1].summary
    assert run.exit_code(findings) == 1
    assert run.exit_code([findings[0], findings[1]]) == 3
    assert run.exit_code([findings[0]]) == 0


def test_case_4_reads_the_journal_of_the_unit_the_vllm_restart_action_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --unit or --log, case 4 reads the journal of the vllm_restart action's unit."""
    import stat
    import sys

    refused = Path(__file__).resolve().parents[3] / "fixtures" / "vllm-0.32.0-startup-vocab-refused.log"
    argv = tmp_path / "argv"
    journalctl = tmp_path / "bin" / "journalctl"
    journalctl.parent.mkdir()
    journalctl.write_text(
        f"#!{sys.executable}\nimport sys\nopen({str(argv)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        f"sys.stdout.write(open({str(refused)!r}).read())\n"
    )
    journalctl.chmod(journalctl.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(journalctl.parent))
    path = config(tmp_path)
    path.write_text(
        path.read_text()
        + "actions:\n  shrink:\n    type: vllm_restart\n    ladder: [5, 3, 1, 0]\n"
        + f"    env_file: {{path: {tmp_path / 's.env'}}}\n    unit: vllm-spec.service\n"
    )
    assert main(["diagnose", "--config", str(path), "--case", "4"]) == 1
    assert argv.read_text().startswith("-u vllm-spec.service ")
    assert "4. Vocabulary mismatch at start-up: CAUSE FOUND" in capsys.readouterr().out

    argv.unlink()  # --log given: that file, and no journal
    assert main(["diagnose", "--config", str(path), "--case", "4", "--log", str(refused)]) == 1
    assert not argv.exists()
