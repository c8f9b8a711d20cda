"""`specguard serve-config` as a user runs it: --from-legacy with the playbook's old command, the
output forms, --out and --write-serving, the version from --url, and every kind of bad input as one
line, exit status 2 and nothing written."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from specguard.cli.entry import main
from specguard.playbook.serve_config.legacy import LegacyError, parse_legacy
from specguard.playbook.serve_config.serving import load_serving
from specguard.playbook.serve_config.versions import parse_version
from tests.ports import free_port

# The playbook's command, written for the old flags.
PLAYBOOK_COMMAND = (
    "python -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct "
    "--speculative-model yuhuili/EAGLE-LLaMA3.1-Instruct-8B --speculative-method eagle "
    "--num-speculative-tokens 5 --speculative-disable-mqa-scorer --use-v2-block-manager "
    "--speculative-disable-by-batch-size 8 --max-model-len 8192 --port 8000 --enable-prefix-caching"
)
SERVING = "target: /models/target\nmethod: draft_model\ndraft: /models/draft\nnum_speculative_tokens: 4\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["serve-config", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_playbook_command_for_0_32(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "--vllm-version", "0.32.0", "--format", "json", "--from-legacy", PLAYBOOK_COMMAND
    )
    assert code == 0
    result = json.loads(out)
    assert result["speculative_config"] == {
        "method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 5,
    }  # fmt: skip
    assert result["argv"][:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert result["argv"][-1] == "--enable-prefix-caching"
    dropped = [line for line in err.splitlines() if "dropped" in line]
    assert dropped == [
        "specguard serve-config: dropped --speculative-disable-mqa-scorer (disable_mqa_scorer): vLLM 0.32.0 refuses "
        "it at start-up (unknown keys are an error from 0.16); it was removed in vLLM 0.10.0",
        "specguard serve-config: dropped --use-v2-block-manager: the V2 block manager became vLLM's only one and the "
        "flag went away (vLLM 0.32.0 has no such option); nothing replaces it",
        "specguard serve-config: dropped --speculative-disable-by-batch-size (disable_by_batch_size): vLLM 0.32.0 "
        "refuses it at start-up (unknown keys are an error from 0.16); it was removed in vLLM 0.17.0",
    ]


def test_an_old_version_gets_its_own_reasons() -> None:
    legacy = parse_legacy(PLAYBOOK_COMMAND, parse_version("0.15.1"))
    assert [line.split(":")[0] for line in legacy.dropped] == [
        "dropped --speculative-disable-mqa-scorer (disable_mqa_scorer)",
        "dropped --use-v2-block-manager",
        "dropped --speculative-disable-by-batch-size (disable_by_batch_size)",
    ]
    assert "vLLM 0.15.1 ignores it" in legacy.dropped[0]
    assert "vLLM 0.15.1 accepts it but does not use it" in legacy.dropped[2]


def test_the_other_old_flags_become_keys() -> None:
    command = (
        "vllm serve /t --speculative-model '[ngram]' --num-speculative-tokens=3 --ngram-prompt-lookup-max 4 "
        "--ngram-prompt-lookup-min 2 --speculative-draft-tensor-parallel-size 1 -tp 2 "
        "--spec-decoding-acceptance-method typical_acceptance_sampler --speculative-max-model-len 2048"
    )
    legacy = parse_legacy(command, parse_version("0.32.0"))
    assert legacy.data == {
        "target": "/t", "method": "ngram", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1,
        "tensor_parallel_size": 2,
        "speculative_extra": {"prompt_lookup_max": 4, "prompt_lookup_min": 2, "max_model_len": 2048},
    }  # fmt: skip
    assert [line.split(":")[0] for line in legacy.dropped] == [
        "dropped --spec-decoding-acceptance-method (acceptance_method)"
    ]


def test_a_draft_without_a_method_is_draft_model_and_says_so() -> None:
    legacy = parse_legacy(
        "vllm serve /t --speculative-model /d --num-speculative-tokens 2", parse_version("0.32.0")
    )
    assert legacy.data["method"] == "draft_model" and legacy.data["draft"] == "/d"
    assert len(legacy.notes) == 1 and "assumed" in legacy.notes[0]


@pytest.mark.parametrize(
    ("command", "says"),
    [("vllm serve /t --speculative-model '/d", "cannot split the command"),
     ("vllm serve /t --num-speculative-tokens", "--num-speculative-tokens needs a value"),
     ("vllm serve /t --num-speculative-tokens five", "--num-speculative-tokens 'five': not an integer"),
     ("vllm serve /t --speculative-config '{bad'", "--speculative-config: not JSON")],
)  # fmt: skip
def test_a_command_that_cannot_be_read_says_why(command: str, says: str) -> None:
    with pytest.raises(LegacyError, match=says.replace("(", r"\(")):
        parse_legacy(command, parse_version("0.32.0"))


def test_the_serving_file_written_from_a_command_renders_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = tmp_path / "serving.yaml"
    code, first, _ = run(capsys, "--vllm-version", "0.32.0", "--format", "command", "--write-serving", str(written),
                         "--from-legacy", PLAYBOOK_COMMAND)  # fmt: skip
    assert code == 0 and first.startswith(f"wrote {written}\n")
    assert load_serving(written).vllm_version == "0.32.0"
    code, again, _ = run(capsys, str(written), "--format", "command")
    assert code == 0 and again == first.split("\n", 1)[1]


def test_the_default_output_has_the_three_artifacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.yaml").write_text(SERVING)
    code, out, _ = run(capsys, str(tmp_path / "s.yaml"), "--vllm-version", "0.15.1")
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("==> ")] == [
        "==> command line (vLLM 0.15.1) <==",
        "==> vllm.yaml (vLLM 0.15.1: vllm serve --config vllm.yaml) <==",
        "==> vllm.env (the vllm_restart action's env_file: VLLM_SPECULATIVE_CONFIG) <==",
    ]
    assert 'speculative-config: \'{"method": "draft_model"' in out  # a JSON string before 0.16


def test_out_writes_three_files_and_replaces_them_only_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.yaml").write_text(SERVING)
    out_dir = tmp_path / "out"
    code, out, _ = run(capsys, str(tmp_path / "s.yaml"), "--vllm-version", "0.32.0", "--out", str(out_dir))
    assert code == 0 and sorted(p.name for p in out_dir.iterdir()) == ["command.sh", "vllm.env", "vllm.yaml"]
    assert "env_file: {path: " in out
    assert (out_dir / "command.sh").stat().st_mode & 0o100
    before = {p.name: p.read_text() for p in out_dir.iterdir()}
    (tmp_path / "s.yaml").write_text(SERVING.replace("4", "3"))
    code, _, err = run(capsys, str(tmp_path / "s.yaml"), "--vllm-version", "0.32.0", "--out", str(out_dir))
    assert (
        code == 2
        and err == f"specguard serve-config: {out_dir / 'vllm.yaml'} exists: give --force to replace it\n"
    )
    assert {p.name: p.read_text() for p in out_dir.iterdir()} == before
    code, _, _ = run(
        capsys, str(tmp_path / "s.yaml"), "--vllm-version", "0.32.0", "--out", str(out_dir), "--force"
    )
    assert code == 0 and '"num_speculative_tokens":3' in (out_dir / "vllm.env").read_text()


@pytest.mark.parametrize(
    ("content", "argv", "says"),
    [
        (SERVING.replace("draft_model", "eagle9"), [], "s.yaml:2: method: unknown speculative method 'eagle9'"),
        (SERVING.replace("4", "0"), [], "s.yaml:4: num_speculative_tokens: Input should be greater than 0"),
        (SERVING, ["--vllm-version", "0.14.0"], "s.yaml:2: method: method 'draft_model' needs vLLM 0.15.0 or later"),
        (SERVING + "speculative_extra: {disable_by_batch_size: 4}\n", [],
         "s.yaml:5: speculative_extra.disable_by_batch_size: vLLM 0.32.0 refuses it at start-up"),
        (SERVING + "port: [\n", [], "s.yaml:6: invalid YAML"),
        (SERVING, ["--vllm-version", "0.9.2"], "--vllm-version 0.9.2: vLLM 0.9.2 is older than 0.10.0"),
        (SERVING, ["--vllm-version", "latest"], "--vllm-version latest: 'latest' is not a vLLM version"),
        (SERVING, ["--vllm-version", "0.18.0", "--short-flag"], "-sc needs vLLM 0.19.0 or later, not 0.18.0"),
        (SERVING, ["--vllm-version", "0.32.0", "--from-legacy", "vllm serve x"], "give a serving file, or --from-legacy"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, argv: list[str], says: str
) -> None:
    (tmp_path / "s.yaml").write_text(content)
    if "--vllm-version" not in argv:
        argv = [*argv, "--vllm-version", "0.32.0"]
    code, out, err = run(capsys, str(tmp_path / "s.yaml"), *argv, "--out", str(tmp_path / "out"))
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specguard serve-config: ") and says in lines[0], lines
    assert str(tmp_path / "s.yaml") in lines[0] or "s.yaml" not in says
    assert not (tmp_path / "out").exists()


def test_a_file_without_a_version_asks_for_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text(SERVING)
    code, _, err = run(capsys, str(tmp_path / "s.yaml"))
    assert code == 2 and "no vLLM version: give --vllm-version, --url, or the file's vllm_version" in err
    (tmp_path / "s.yaml").write_text('vllm_version: "0.32.0"\n' + SERVING)
    assert run(capsys, str(tmp_path / "s.yaml"), "--format", "env")[0] == 0


def test_a_legacy_command_without_k_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "--vllm-version", "0.32.0", "--write-serving", str(tmp_path / "s.yaml"),
                       "--from-legacy", "vllm serve /t --speculative-model /d")  # fmt: skip
    assert (
        code == 2 and err == "specguard serve-config: --from-legacy: num_speculative_tokens: Field required\n"
    )
    assert not (tmp_path / "s.yaml").exists()


class _Version(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"version": "0.15.1"}' if self.path == "/version" else b"{}"
        self.send_response(200 if self.path == "/version" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def version_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Version)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_version_is_read_from_a_running_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version_server: str
) -> None:
    (tmp_path / "s.yaml").write_text('vllm_version: "0.32.0"\n' + SERVING)
    code, out, _ = run(capsys, str(tmp_path / "s.yaml"), "--url", version_server, "--format", "yaml")
    assert code == 0 and out.startswith("# vLLM 0.15.1's options")  # the server's, over the file's


def test_an_unreachable_url_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "s.yaml").write_text(SERVING)
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, str(tmp_path / "s.yaml"), "--url", url)
    assert code == 2 and out == ""
    assert (
        err.startswith(f"specguard serve-config: --url {url}: cannot reach {url}/version: ")
        and err.count("\n") == 1
    )
