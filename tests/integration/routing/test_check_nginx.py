"""`specguard check` with a `routing:` section runs `nginx -t` on the rendered router, with the
host's nginx: what nginx would refuse at a reload is an error of the check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specguard.cli.entry import main
from tests.nginx_router import require_nginx, routing_config


def write_config(tmp_path: Path, standard: str) -> Path:
    path = tmp_path / "specguard.yaml"
    path.write_text(
        yaml.safe_dump({"routing": routing_config("127.0.0.1:8000", standard, tmp_path / "flag.json")})
    )
    return path


def test_check_passes_a_router_nginx_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_nginx()
    assert main(["check", "--config", str(write_config(tmp_path, "127.0.0.1:8001"))]) == 0
    out = capsys.readouterr().out
    assert "routing: 3 class(es), nginx -t passed (nginx/" in out


def test_check_fails_on_what_nginx_refuses_and_quotes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_nginx()
    config = write_config(tmp_path, "no-such-host.invalid:8001")
    assert main(["check", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert f"{config}: routing: nginx -t refuses the rendered router:" in err
    assert 'host not found in upstream "no-such-host.invalid:8001"' in err


def test_check_without_nginx_on_the_host_says_it_did_not_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["check", "--config", str(write_config(tmp_path, "127.0.0.1:8001"))]) == 0
    assert "routing: nginx is not installed on this host; `nginx -t` not run" in capsys.readouterr().out
