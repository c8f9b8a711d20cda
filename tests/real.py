"""The rule for tests that need a real external program (Prometheus, Alertmanager, vLLM...).

On a developer machine a missing program skips the test. A run that must prove the real thing works
(CI, a release check) sets ``SPECGUARD_REQUIRE_REAL=1``, and then a missing program is a failure:
a skip there would pass silently without testing anything.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_REAL = "SPECGUARD_REQUIRE_REAL"
VLLM_PYTHON = "SPECGUARD_VLLM_PYTHON"


def require_binary(name: str, package: str) -> str:
    """The path of the executable ``name``; skip (or fail, see above) when it is not installed."""
    path = shutil.which(name)
    if path is not None:
        return path
    missing(f"{name} is not installed: install the {package!r} package (apt-get install {package})")


def require_vllm_python() -> str:
    """The Python interpreter that has vLLM, named by ``$SPECGUARD_VLLM_PYTHON``.

    vLLM lives in a venv of its own (``make e2e`` creates ``.venv-vllm``) so that the project's venv
    never holds vllm, torch or transformers. Unset or not an executable: skip (or fail, see above).
    """
    value = os.environ.get(VLLM_PYTHON, "")
    if not value:
        missing(f"{VLLM_PYTHON} is not set: run `make e2e`, which installs vLLM into .venv-vllm and sets it")
    path = os.path.abspath(value)  # not resolved: a venv's python is a symlink out of the venv
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        missing(f"{VLLM_PYTHON}={value} is not an executable: run `make e2e`, which installs it")
    return path


def missing(message: str) -> NoReturn:
    """Skip for ``message``, or fail when SPECGUARD_REQUIRE_REAL=1 (see above)."""
    if os.environ.get(REQUIRE_REAL) == "1":
        pytest.fail(f"{message}; {REQUIRE_REAL}=1 forbids skipping real-component tests", pytrace=False)
    pytest.skip(message)
