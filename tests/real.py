"""The rule for tests that need a real external program (Prometheus, Alertmanager...).

On a developer machine a missing program skips the test. A run that must prove the real thing works
(CI, a release check) sets ``SPECGUARD_REQUIRE_REAL=1``, and then a missing program is a failure:
a skip there would pass silently without testing anything.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRE_REAL = "SPECGUARD_REQUIRE_REAL"


def require_binary(name: str, package: str) -> str:
    """The path of the executable ``name``; skip (or fail, see above) when it is not installed."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed: install the {package!r} package (apt-get install {package})"
    if os.environ.get(REQUIRE_REAL) == "1":
        pytest.fail(f"{message}; {REQUIRE_REAL}=1 forbids skipping real-component tests", pytrace=False)
    pytest.skip(message)
