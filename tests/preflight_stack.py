"""A serving host for preflight's tests, as the demo builds one: simulators as vLLM (each with its
truth set by its options), a real specguard daemon scraping them and keeping their history in its
state database, and `specguard bench` runs as their production traffic (one of them writing the
baseline against a plain simulator)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.ports import free_port
from tests.processes import Daemon

SPECULATIVE = ("--spec-method", "draft_model", "--spec-model", "tiny-draft", "--spec-tokens", "3")
RULES = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    window: 20s
    interval: 1s
    condition: "< 0.3"
    for: 2s
    actions: [log]
"""


class Sim:
    """One ``specguard simulate`` process on a port of its own."""

    def __init__(self, root: Path, name: str, *options: str) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics = f"{self.url}/metrics"
        self.instance = f"127.0.0.1:{self.port}"
        log = (root / f"sim-{name}.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "specguard", "simulate", "--port", str(self.port), "--step-time", "0.002",
             "--seed", "3", *options],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def wait(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"simulator {self.name} exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"simulator {self.name} did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def bench(url: str, *options: str, timeout: float = 300.0) -> str:
    """``specguard bench`` against ``url``: the traffic the daemon records; what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "specguard", "bench", "--url", url, "--classes", "chat,code", "--max-tokens", "64",
         *options],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"bench {url} {options}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done.stdout


class Stack:
    """Simulators, the daemon recording their history, and what a preflight config names."""

    def __init__(self, root: Path, sims: dict[str, Sequence[str]]) -> None:
        self.root = root
        self.state = root / "state"
        self.sims = {name: Sim(root, name, *options) for name, options in sims.items()}
        (root / "rules.yaml").write_text(RULES)
        self.port = free_port()
        config = root / "daemon.yaml"
        config.write_text(json.dumps({
            "server": {"port": self.port}, "state_dir": str(self.state), "interval": "1s", "rules": ["rules.yaml"],
            "sources": {"scrape": {"targets": [s.metrics for s in self.sims.values()], "timeout": "5s"}},
        }))  # fmt: skip
        self.daemon = Daemon(config, self.port, root / "daemon.log")

    @property
    def store(self) -> Path:
        return self.state / "specguard.db"

    def start(self) -> None:
        """The simulators, then the daemon, once it has scraped each of them (history counts what
        grows from one scrape to the next: traffic before its first scrape would not be kept)."""
        for sim in self.sims.values():
            sim.wait()
        started = time.time()
        self.daemon.start()
        self.recorded_after(started, list(self.sims))

    def stop(self) -> None:
        if self.daemon.process is not None and self.daemon.process.poll() is None:
            self.daemon.stop()
        for sim in self.sims.values():
            sim.stop()

    def recorded_after(self, moment: float, names: Sequence[str], timeout: float = 120.0) -> None:
        """Wait until history holds a scrape of each of ``names`` taken after ``moment`` (epoch)."""
        wanted = {self.sims[name].instance for name in names}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.store.is_file():
                with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=5) as db:
                    try:
                        rows = db.execute("SELECT instance, at FROM history_last").fetchall()
                    except sqlite3.OperationalError:
                        rows = []
                if wanted <= {str(i) for i, at in rows if float(at) > moment}:
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"the daemon recorded no scrape of {sorted(wanted)} after {moment} in {timeout:.0f} s"
        )

    def config(self, name: str, sims: Sequence[str], **extra: Any) -> Path:
        """A preflight config naming ``sims``, reading the daemon's state database."""
        path = self.root / f"{name}.yaml"
        data: dict[str, Any] = {
            "state_dir": str(self.state),
            "rules": ["rules.yaml"],
            "sources": {"scrape": {"targets": [self.sims[s].metrics for s in sims]}},
            **extra,
        }
        path.write_text(json.dumps(data))
        return path
