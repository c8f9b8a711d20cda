"""specguard as an operator installs it: the wheel that `python -m build` makes, installed into a
fresh virtualenv with nothing of the source tree beside it.

Built and installed once per test session (the build takes setuptools from the package index, and
the install the daemon's dependencies: tens of seconds on a fresh machine).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    sdist: Path
    home: Path  # an empty directory the installed commands run in (and take as $HOME)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def specguard(self) -> Path:
        return self.bin / "specguard"

    @property
    def metadata(self) -> dict[str, list[str]]:
        """The wheel's METADATA, each field's values in order."""
        with zipfile.ZipFile(self.wheel) as wheel:
            (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
            message = Parser().parsestr(wheel.read(name).decode())
        fields: dict[str, list[str]] = {}
        for key, value in message.items():
            fields.setdefault(key, []).append(value)
        return fields

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of an installed command: no PYTHONPATH, HOME and the XDG directories
        in ``home``, so that nothing of the source tree or of this user's state is found."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SPECGUARD_", "XDG_"))}
        env.update(HOME=str(self.home), XDG_STATE_HOME=str(self.home / "state"), **extra)
        return env

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``specguard ARGS`` from the install, in ``home``."""
        return subprocess.run(
            [str(self.specguard), *args], cwd=self.home, env=self.env(), capture_output=True,
            text=True, timeout=timeout, check=False,
        )  # fmt: skip

    async def arun(self, *args: str, timeout: float = 60) -> tuple[int, str, str]:
        """``run`` without blocking the event loop (for a test that serves what specguard reads)."""
        process = await asyncio.create_subprocess_exec(
            str(self.specguard), *args, cwd=self.home, env=self.env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "python"), "-c", code], cwd=self.home, env=self.env(),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip


def _checked(command: list[str], what: str, cwd: Path, timeout: float) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def build_and_install(directory: Path) -> Installed:
    """``python -m build`` of the source tree (the sdist, then the wheel built from it), and the
    wheel installed into a new virtualenv under ``directory``."""
    dist = directory / "dist"
    _checked([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)], "python -m build", REPO, 600)
    (wheel,) = dist.glob("specguard-*.whl")
    (sdist,) = dist.glob("specguard-*.tar.gz")
    venv = directory / "venv"
    _checked([sys.executable, "-m", "venv", str(venv)], "python -m venv", directory, 120)
    home = directory / "home"
    home.mkdir()
    # From an empty directory, by the wheel's path: pip must not see the source tree.
    _checked([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], "pip install", home, 600)
    return Installed(venv=venv, wheel=wheel, sdist=sdist, home=home)
