"""The distribution: `python -m build` makes a wheel and an sdist, and the wheel, installed into a
fresh virtualenv with no source tree beside it, is a working specguard on its shipped rule pack,
and its playbook tool, `specguard bench`, runs from it without any extra.

The install is tests/installed.py's, made once per session; every command here runs the installed
`specguard`, from an empty directory, with no PYTHONPATH.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.installed import REPO, Installed
from tests.ports import free_port
from tests.processes import Daemon

# The parts of the one import package: top-level folders of the tree, linked from specguard/.
PACKAGES = {link.name for link in (REPO / "specguard").iterdir() if link.is_symlink()}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _setup_parts() -> set[str]:
    """The parts setup.py maps under ``specguard`` (its PARTS tuple)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    (parts,) = [
        node.value for node in tree.body
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["PARTS"]
    ]  # fmt: skip
    return set(ast.literal_eval(parts))


def test_the_links_in_the_tree_the_parts_setup_maps_and_the_top_level_packages_agree() -> None:
    folders = {
        p.parent.name for p in REPO.glob("*/__init__.py") if p.parent.name not in {"specguard", "tests"}
    }
    assert PACKAGES == _setup_parts() == folders
    for part in PACKAGES:  # each link names the folder of its own name, relatively (a clone moves)
        assert (REPO / "specguard" / part).readlink() == Path("..") / part


def test_the_wheel_installs_one_top_level_name_specguard(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    assert {name.split("/")[0] for name in names if not name.startswith("specguard-")} == {"specguard"}
    assert {
        name.split("/")[1] for name in names if name.count("/") >= 2 and name.startswith("specguard/")
    } == PACKAGES
    # Installed: what pip put in site-packages for specguard is the package and its dist-info.
    (site,) = installed.venv.glob("lib/python*/site-packages")
    (record,) = site.glob("specguard-*.dist-info/RECORD")
    paths = [line.split(",")[0] for line in record.read_text().splitlines()]
    tops = {path.split("/")[0] for path in paths if not path.startswith("../")}  # ../../../bin: the command
    assert {top for top in tops if not top.endswith(".dist-info")} == {"specguard"}
    # None of the old generic names is importable from the install; the command and -m both work.
    done = installed.python(
        "import importlib.util as u; print([n for n in ('daemon', 'common', 'report', 'rules', 'sim') if u.find_spec(n)])"
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    module = subprocess.run(
        [str(installed.bin / "python"), "-m", "specguard", "--version"], cwd=installed.home,
        env=installed.env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert module.returncode == 0, module.stderr
    assert module.stdout == installed.run("--version").stdout


def test_the_wheel_holds_the_packages_and_their_data_and_no_tests(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    assert not [name for name in names if "/tests/" in name or name.startswith(("tests/", "benchmarks/"))]
    assert "specguard/rules/packs/speculative.yaml" in names
    assert "specguard/playbook/bench/prompts/chat.jsonl" in names
    assert "specguard/playbook/routing/specguard_routing.lua" in names  # the router render copies
    assert "specguard/cli/__init__.py" in names
    # The license, as PEP 639 places it, byte for byte the file in the tree.
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(installed.wheel) as wheel:
        assert wheel.read(license_file) == (REPO / "LICENSE").read_bytes()


def test_the_license_is_apache_2_0_in_the_tree_the_metadata_and_the_sdist(installed: Installed) -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text
    assert installed.metadata["License-Expression"] == ["Apache-2.0"]
    assert installed.metadata["License-File"] == ["LICENSE"]
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    with tarfile.open(installed.sdist) as sdist:
        (member,) = [m for m in sdist.getmembers() if m.name.split("/", 1)[-1] == "LICENSE"]
        carried = sdist.extractfile(member)
        assert carried is not None and carried.read() == (REPO / "LICENSE").read_bytes()


def test_the_sdist_carries_the_units_the_example_config_the_dashboard_and_the_docs(
    installed: Installed,
) -> None:
    with tarfile.open(installed.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for path in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "systemd/specguard.service",
        "systemd/vllm.service",
        "systemd/vllm.service.d/specguard.conf",
        "systemd/polkit/50-specguard-vllm.rules",
        "deploy/specguard.example.yaml",
        "deploy/grafana/specguard.json",
        "rules/packs/speculative.yaml",
        "mkdocs.yml",
        "docs/index.md",
        "docs/install.md",
    ):
        assert path in names, path


def test_the_extras_are_named_for_what_they_bring_and_the_daemon_needs_none(installed: Installed) -> None:
    metadata = installed.metadata
    assert set(metadata["Provides-Extra"]) == {"charts", "dev", "playbook", "fleet"}
    required = metadata["Requires-Dist"]
    assert [r for r in required if r.startswith("matplotlib")] == ['matplotlib>=3.8; extra == "charts"']
    assert [r for r in required if r.startswith("transformers")] == [
        'transformers<6,>=5.19; extra == "playbook"'
    ]
    # the fleet's store clients, only when a coordination: section names that store
    assert [r for r in required if r.startswith(("redis", "etcd3gw"))] == [
        'redis<9,>=5.0.1; extra == "fleet"',
        'etcd3gw<3,>=2.4; extra == "fleet"',
    ]
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
        "redis",
        "etcd3gw",
    }
    # Installed without extras: no matplotlib nor the fleet's clients, and the daemon's modules import
    # without them.
    assert installed.python("import matplotlib").returncode != 0
    assert (
        installed.python("import redis").returncode != 0
        and installed.python("import etcd3gw").returncode != 0
    )
    done = installed.python(
        "import specguard.daemon.runtime, specguard.cli, specguard.cli.entry, specguard.report.weekly, sys; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'matplotlib', 'transformers', 'torch', 'vllm', 'redis', 'etcd3gw'}))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level modules the shipped packages import, other than the standard library and their
    own, each with the files that import it."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "specguard" and top != "__future__":
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def _distribution(requirement: str) -> str:
    name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503's normalized name


# pydantic pins its pydantic-core to one exact version: declaring it beside pydantic could only
# conflict with that pin.
BROUGHT_BY_PIN = {"pydantic-core": "pydantic"}


def test_every_third_party_module_the_code_imports_is_a_declared_dependency(installed: Installed) -> None:
    """A module imported directly but only present because another dependency brings it breaks
    when that dependency stops bringing it (as requests and urllib3 came with prometheus-api-client)."""
    declared = {_distribution(r) for r in installed.metadata["Requires-Dist"]}
    providers = importlib.metadata.packages_distributions()  # this test environment's, extras included
    undeclared = {}
    for module, files in sorted(_third_party_imports().items()):
        assert module in providers, f"{module} (imported by {sorted(files)}) is not installed here"
        names = {re.sub(r"[-_.]+", "-", d).lower() for d in providers[module]}
        if not names & (declared | set(BROUGHT_BY_PIN)):
            undeclared[module] = sorted(files)
    assert undeclared == {}
    # The list above is not vacuous: it holds the imports the Prometheus source makes itself.
    assert {"requests", "urllib3", "prometheus_api_client"} <= set(_third_party_imports())
    assert {"requests", "urllib3"} <= declared


def test_the_installed_modules_come_from_the_venv_and_no_test_code_is_there(installed: Installed) -> None:
    done = installed.python(
        "import specguard.daemon, specguard.rules as r; print(specguard.daemon.__file__); print(r.__file__)"
    )
    assert done.returncode == 0, done.stderr
    for path in done.stdout.split():
        assert Path(path).is_relative_to(installed.venv), path
    assert installed.python("import tests").returncode != 0
    # Everything pip installed for specguard, from its RECORD: no test module among it.
    (record,) = installed.venv.glob("lib/python*/site-packages/specguard-*.dist-info/RECORD")
    files = [line.split(",")[0] for line in record.read_text().splitlines()]
    assert "specguard/daemon/runtime.py" in files
    assert not [f for f in files if f.startswith("tests/") or Path(f).name.startswith(("test_", "conftest"))]


def test_version_is_the_one_pyproject_declares(installed: Installed) -> None:
    version = PYPROJECT["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert installed.metadata["Version"] == [version]
    done = installed.python("import importlib.metadata; print(importlib.metadata.version('specguard'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == version  # what pip recorded in the venv
    done = installed.run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"specguard {version}"


def test_check_and_signals_work_on_the_shipped_pack(installed: Installed) -> None:
    done = installed.run("check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("OK: 8 rules in 1 file(s)")  # the shipped pack, from package data
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
        "latency_regression", "memory_pressure", "speculation_unprofitable", "latency_mean_regression",
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


def test_bench_measures_the_installed_simulator_without_any_extra(installed: Installed) -> None:
    """The playbook's tool needs nothing beyond the wheel: the installed `specguard simulate` on a
    loopback port, and a short `specguard bench` against it, both from the venv without extras."""
    assert installed.python("import matplotlib").returncode != 0  # no extra here
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    k = 3
    with (installed.home / "simulate.log").open("wb") as log:
        simulator = subprocess.Popen(
            [str(installed.specguard), "simulate", "--port", str(port), "--seed", "1",
             "--speculative-config", json.dumps({"method": "draft_model", "model": "draft", "num_speculative_tokens": k}),
             "--step-time", "0.002"],
            cwd=installed.home, env=installed.env(), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        _wait_healthy(simulator, url, installed.home / "simulate.log")
        baseline = installed.home / "baseline.json"
        done = installed.run(
            "bench", "--url", url, "--classes", "chat", "--num-prompts", "6", "--concurrency", "2",
            "--max-tokens", "16", "--warmup", "0", "--json", "--write-baseline", str(baseline),
            "--method", "draft_model",
        )  # fmt: skip
    finally:
        simulator.terminate()
        try:
            simulator.wait(timeout=15)
        except subprocess.TimeoutExpired:
            simulator.kill()
            simulator.wait()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["partial"] is False
    assert report["server"]["draft_positions"] == k
    summary = report["phases"]["chat"]["summary"]
    assert (summary["requests"], summary["completed"]) == (6, 6)
    assert summary["output_tokens"] == 6 * 16  # every request made --max-tokens (ignore_eos)
    acceptance = report["phases"]["chat"]["acceptance"]  # read from the simulator's /metrics
    assert acceptance["drafts"] > 0 and 0 < acceptance["accepted_tokens"] <= acceptance["draft_tokens"]
    written = json.loads(baseline.read_text())
    assert "tiny-llama" in json.dumps(written)  # the baseline the latency rules read, per model


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 60) -> None:
    """Until the simulator answers /health (its port refuses connections while it starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"specguard simulate exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"specguard simulate did not answer /health in {timeout:.0f} s:\n{log.read_text()[-3000:]}")
