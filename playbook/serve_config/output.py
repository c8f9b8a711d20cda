"""Where the artifacts go: the files of ``--out DIR`` and ``--write-serving`` (every one checked
before any is written, each written atomically, none replaced without ``--force``), and the vLLM
version read from a running server's ``/version``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from specguard.actions.vllm_restart.params import EnvFile, VllmConfigFile
from specguard.common.files import write_atomically

YAML_NAME = "vllm.yaml"
ENV_NAME = "vllm.env"
COMMAND_NAME = "command.sh"
VERSION_ANSWER_LIMIT = 64 * 1024


class OutputError(ValueError):
    """A file that may not be written (there already, without --force), or a server that does not say its version."""


def out_files(directory: Path, yaml_text: str, env_text: str, command_text: str) -> dict[Path, str]:
    return {
        directory / YAML_NAME: yaml_text,
        directory / ENV_NAME: env_text,
        directory / COMMAND_NAME: command_text,
    }


def check_writable(files: Mapping[Path, str], force: bool) -> None:
    """Raise OutputError, before anything is written, for a file that is there already (without
    ``force``) or whose directory is not a directory."""
    for path in files:
        if path.exists() and not force:
            raise OutputError(f"{path} exists: give --force to replace it")
        if path.exists() and not path.is_file():
            raise OutputError(f"{path} is not a file")
        parent = path.parent
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"{parent} is not a directory")


def write_files(files: Mapping[Path, str]) -> None:
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text, keep_previous=False)
        if path.name == COMMAND_NAME:
            path.chmod(path.stat().st_mode | 0o111)


def restart_settings(directory: Path) -> str:
    """How the ``vllm_restart`` action points at the files written (its own settings' form)."""
    env = EnvFile(path=(directory / ENV_NAME).absolute())
    config = VllmConfigFile(path=(directory / YAML_NAME).absolute())
    return (
        "for the vllm_restart action, one of:\n"
        f"  env_file: {{path: {env.path}}}\n"
        f"  vllm_config: {{path: {config.path}}}"
    )


def fetch_version(url: str, timeout: float = 10.0) -> str:
    """A running vLLM's version, from ``GET URL/version`` (``{"version": "0.32.0"}``)."""
    if not url.startswith(("http://", "https://")):
        raise OutputError(f"--url {url}: give the server's http:// or https:// base URL")
    address = url.rstrip("/") + "/version"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as response:
            body = response.read(VERSION_ANSWER_LIMIT + 1)
    except urllib.error.HTTPError as exc:
        raise OutputError(f"--url {url}: {address} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OutputError(f"--url {url}: cannot reach {address}: {reason}") from None
    if len(body) > VERSION_ANSWER_LIMIT:
        raise OutputError(f"--url {url}: {address} answered more than {VERSION_ANSWER_LIMIT} bytes")
    try:
        version = json.loads(body).get("version")
    except (ValueError, AttributeError):
        version = None
    if not isinstance(version, str):
        raise OutputError(f'--url {url}: {address} did not answer {{"version": "..."}} as vLLM does')
    return version
