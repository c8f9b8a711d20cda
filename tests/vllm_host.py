"""A serving host for the vllm_restart action's tests: the simulator as vLLM, supervised the way
systemd restarts vLLM (tests/supervisor.py: the command line expanded from the environment file),
reading its speculative config from an environment file or a vLLM YAML config."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from specguard.actions.vllm_restart import VllmRestartAction, VllmRestartParams, speculative
from tests.ports import free_port

DRAFT = {"method": "draft_model", "model": "tiny-draft", "num_speculative_tokens": 4}


class Host:
    """A serving host: the simulator as vLLM, supervised, reading its speculative config from an
    environment file or a vLLM YAML config."""

    def __init__(self, tmp: Path, style: str, *options: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = tmp / "service"
        self.style = style
        sim = [sys.executable, "-m", "specguard", "simulate", "--port", str(self.port), "--startup-delay", "0.3",
               "--step-time", "0.002", "--acceptance-by-position", "0.9", *options]  # fmt: skip
        supervise = [sys.executable, "-m", "tests.supervisor", "restart", "--state", str(self.state)]
        if style == "env":
            self.path = tmp / "speculative.env"
            self.path.write_text(speculative.render_env(DRAFT, "as deployed"))
            # as systemd/vllm.service passes it: through a shell, nothing at all when it is empty
            line = " ".join(shlex.quote(word) for word in sim)
            passed = '${VLLM_SPECULATIVE_CONFIG:+"--speculative-config=$VLLM_SPECULATIVE_CONFIG"}'
            self.command = [
                *supervise,
                "--env-file",
                str(self.path),
                "--",
                "/bin/sh",
                "-c",
                f"exec {line} {passed}",
            ]
        else:
            self.path = tmp / "vllm.yaml"
            self.path.write_text(
                "# vLLM options for this host\n"
                "model: tiny-llama   # served name\n"
                "speculative-config:\n"
                "  method: draft_model   # the small Llama\n"
                "  model: tiny-draft\n"
                "  num_speculative_tokens: 4\n"
                "max-num-seqs: 64\n"
            )
            self.command = [*supervise, "--", *sim, "--config", str(self.path)]

    def start(self) -> None:
        subprocess.run(self.command, check=True, timeout=60)

    def stop(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "tests.supervisor", "stop", "--state", str(self.state)], timeout=60
        )

    def action(self, **extra: Any) -> VllmRestartAction:
        where = (
            {"env_file": {"path": str(self.path)}}
            if self.style == "env"
            else {"vllm_config": {"path": str(self.path)}}
        )
        raw = {"type": "vllm_restart", "ladder": [4, 2, 0], "url": self.url, "command": self.command,
               "health_timeout": "30s", **where, **extra}  # fmt: skip
        return VllmRestartAction("shrink", VllmRestartParams.model_validate(raw))

    def commands(self) -> list[dict[str, Any]]:
        """Each start: the command and the environment file's variables."""
        return [json.loads(line) for line in (self.state / "commands").read_text().splitlines()]

    @property
    def status_command(self) -> list[str]:
        """Exits 0 while the server's process runs, 1 (saying how it ended) once it has exited."""
        return [sys.executable, "-m", "tests.supervisor", "status", "--state", str(self.state)]

    def break_config(self) -> None:
        """Edit the file as someone might: the draft gone, which the server refuses to start with
        (the one running goes on with the config it read at start)."""
        broken = {"num_speculative_tokens": 4, "prompt_lookup_max": 3}
        text = self.path.read_text()
        self.path.write_text(
            speculative.render_env(broken, "edited")
            if self.style == "env"
            else speculative.render_yaml(text, broken, "0.32.0", "f")
        )

    def systemctl(self, bin_dir: Path) -> None:
        """A systemctl in ``bin_dir`` for this host's unit: ``restart`` runs the supervisor's
        restart, ``show`` prints the supervisor's record of the server as systemd's properties."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        show = [sys.executable, "-m", "tests.supervisor", "show", "--state", str(self.state)]
        script = bin_dir / "systemctl"
        script.write_text(
            f"#!{sys.executable}\n"
            "import subprocess, sys\n"
            "verb = [word for word in sys.argv[1:] if not word.startswith('--')][0]\n"
            f"argv = {{'restart': {self.command!r}, 'show': {show!r}}}.get(verb)\n"
            "if argv is None:\n"
            "    sys.exit(f'systemctl stand-in: no {verb}')\n"
            "sys.exit(subprocess.run(argv).returncode)\n"
        )
        script.chmod(0o755)
