"""The distribution: `python -m build` makes a wheel and an sdist, and the wheel, installed into a
fresh virtualenv with no source tree beside it, is a working specguard on its shipped rule pack.

The install is tests/installed.py's, made once per session; every command here runs the installed
`specguard`, from an empty directory, with no PYTHONPATH.
"""

from __future__ import annotations

import json
import re
import signal
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.installed import Installed
from tests.ports import free_port
from tests.processes import Daemon

PACKAGES = {"daemon", "rules", "actions", "common", "sim", "playbook", "report"}


def test_the_wheel_holds_the_packages_and_their_data_and_no_tests(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("specguard-")}
    assert tops == PACKAGES
    assert not [name for name in names if "/tests/" in name or name.startswith(("tests/", "benchmarks/"))]
    assert "rules/packs/speculative.yaml" in names
    assert "playbook/bench/prompts/chat.jsonl" in names
    assert "daemon/cli.py" in names


def test_the_sdist_carries_the_units_the_example_config_and_the_dashboard(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for path in (
        "pyproject.toml",
        "README.md",
        "systemd/specguard.service",
        "systemd/vllm.service",
        "systemd/vllm.service.d/specguard.conf",
        "systemd/polkit/50-specguard-vllm.rules",
        "deploy/specguard.example.yaml",
        "deploy/grafana/specguard.json",
        "rules/packs/speculative.yaml",
    ):
        assert path in names, path


def test_the_extras_are_named_for_what_they_bring_and_the_daemon_needs_none(installed: Installed) -> None:
    metadata = installed.metadata
    assert set(metadata["Provides-Extra"]) == {"charts", "dev"}
    required = metadata["Requires-Dist"]
    assert [r for r in required if r.startswith("matplotlib")] == ['matplotlib>=3.8; extra == "charts"']
    base = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in required if "extra ==" not in r}
    assert "aiohttp" in base and "pydantic" in base
    assert not base & {
        "matplotlib",
        "numpy",
        "pandas",
        "transformers",
        "tokenizers",
        "torch",
        "vllm",
        "pytest",
    }
    # Installed without extras: no matplotlib, and the daemon's modules import without it.
    assert installed.python("import matplotlib").returncode != 0
    done = installed.python(
        "import daemon.runtime, daemon.cli, report.weekly, sys; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'matplotlib', 'transformers', 'torch', 'vllm'}))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_installed_modules_come_from_the_venv_and_no_test_code_is_there(installed: Installed) -> None:
    done = installed.python("import daemon, rules; print(daemon.__file__); print(rules.__file__)")
    assert done.returncode == 0, done.stderr
    for path in done.stdout.split():
        assert Path(path).is_relative_to(installed.venv), path
    assert installed.python("import tests").returncode != 0
    # Everything pip installed for specguard, from its RECORD: no test module among it.
    (record,) = installed.venv.glob("lib/python*/site-packages/specguard-*.dist-info/RECORD")
    files = [line.split(",")[0] for line in record.read_text().splitlines()]
    assert "daemon/runtime.py" in files
    assert not [f for f in files if f.startswith("tests/") or Path(f).name.startswith(("test_", "conftest"))]


def test_version_comes_from_the_package_metadata(installed: Installed) -> None:
    (version,) = installed.metadata["Version"]
    done = installed.run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"specguard {version}"


def test_check_and_signals_work_on_the_shipped_pack(installed: Installed) -> None:
    done = installed.run("check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: 7 rules in 1 file(s)")  # the shipped pack, from package data
    done = installed.run("signals")
    assert done.returncode == 0, done.stderr
    assert "acceptance_rate" in done.stdout and "vllm:spec_decode_num_accepted_tokens_total" in done.stdout
    done = installed.run("check", "--config", str(installed.home / "missing.yaml"))
    assert done.returncode != 0
    assert "missing.yaml" in done.stdout + done.stderr and "Traceback" not in done.stderr


async def test_eval_reads_a_server_with_the_shipped_pack(installed: Installed, vllm: str) -> None:
    code, out, err = await installed.arun(
        "eval", "--once", "--scrape", vllm, "--sample-gap", "1", "--format", "json"
    )
    assert code == 0, err
    rows = json.loads(out)
    assert {row["rule"] for row in rows} == {
        "acceptance_low", "acceptance_critical", "acceptance_fallback", "acceptance_collapse",
        "latency_regression", "memory_pressure", "speculation_unprofitable",
    }  # fmt: skip
    (fallback,) = [row for row in rows if row["rule"] == "acceptance_fallback"]
    assert fallback["labels"]["model_name"] == "tiny-llama"  # read from the replayed server
    assert fallback["value"] == pytest.approx(0.6)  # 30 of 50 draft tokens accepted per scrape


async def test_run_serves_evaluates_and_stops_from_the_install(
    installed: Installed, vllm: str, tmp_path: Path, daemons: list[Daemon]
) -> None:
    port = free_port()
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: {tmp_path / 'state'}\ninterval: 1s\n"
        f"sources: {{scrape: {{targets: [{vllm!r}]}}}}\nrules: [builtin:speculative]\n"
    )
    daemon = Daemon(config, port, tmp_path / "specguard.log", program=[str(installed.specguard)])
    daemons.append(daemon)
    daemon.start(env=installed.env(), cwd=installed.home)
    status = await daemon.wait_for(
        lambda s: any(r["verdict"] in {"ok", "breach"} for r in s["rules"]), timeout=60
    )
    assert {r["rule"] for r in status["rules"]} >= {"acceptance_low", "acceptance_fallback"}
    code, _ = await daemon.get("/healthz")
    assert code == 200
    assert daemon.stop(signal.SIGTERM) == 0
    assert (tmp_path / "state" / "specguard.db").is_file()
    # The report from the same install, without the charts extra: complete, and saying so.
    out = tmp_path / "reports"
    code, _, err = await installed.arun(
        "report", "--config", str(config), "--since", "1h", "--format", "md", "--out", str(out)
    )
    assert code == 0, err
    (page,) = out.glob("*.md")
    text = page.read_text()
    assert "Charts are not included: charts need matplotlib" in text
    assert "tiny-llama on 127.0.0.1:" in text  # the history the installed daemon recorded
