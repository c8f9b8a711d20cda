"""The wheel's packages: one import name, ``specguard``.

Its parts are folders at the top of the repository; ``package_dir`` maps each one under
``specguard`` (``daemon/`` installs as ``specguard.daemon``), as the links in ``specguard/`` do in
the source tree. Everything else is declared in pyproject.toml.
"""

from setuptools import find_packages, setup

# Top to bottom as the layers run (pyproject.toml's import-linter contract holds them).
PARTS = (
    "cli", "demo", "preflight", "backtest", "daemon", "report", "playbook", "sim", "export", "dispatch", "engine",
    "config", "metrics", "sources", "actions", "store", "coordination", "rules", "common",
)  # fmt: skip

setup(
    package_dir={"specguard": "specguard", **{f"specguard.{part}": part for part in PARTS}},
    packages=[
        "specguard",
        *(f"specguard.{name}" for name in find_packages(include=[*PARTS, *(f"{p}.*" for p in PARTS)])),
    ],
)
