"""An nginx of its own running the router rendered with ``--standalone``: started in the foreground
(``daemon off``, a session of its own), ready once its addresses accept connections, reloaded and
stopped on request. The demo, the router benchmark and the tests run nginx this way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from specguard.config.routing import split_host_port
from specguard.playbook.routing.render import nginx_command

START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0


class NginxError(RuntimeError):
    """nginx did not start or reload; the message ends with what its error log said last."""


class RunningNginx:
    """nginx on the standalone configuration in ``directory`` (rendered beforehand)."""

    def __init__(self, binary: str, directory: Path, addresses: Sequence[str]) -> None:
        self.binary = binary
        self.directory = directory.resolve()
        self.addresses = tuple(addresses)  # host:port it must accept connections on to be ready
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def error_log(self) -> Path:
        return self.directory / "logs" / "error.log"

    def said(self, lines: int = 1) -> str:
        """The last lines of nginx's error log."""
        try:
            text = self.error_log.read_text(errors="replace").strip()
        except OSError:
            return "no error log"
        return "\n".join(text.splitlines()[-lines:]) or "an empty error log"

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start nginx and wait until every address accepts; NginxError (nginx stopped) otherwise."""
        self.process = subprocess.Popen(
            nginx_command(self.binary, self.directory, "-g", "daemon off;"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        for address in self.addresses:
            host, port = split_host_port(address)
            while True:
                try:
                    with socket.create_connection((host, port), timeout=0.5):
                        break
                except OSError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise NginxError(f"nginx did not start: {self.said()}") from None
                    time.sleep(0.05)

    def workers(self) -> set[int]:
        """The pids of the worker processes serving the current configuration."""
        if self.process is None:
            return set()
        found = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                command = (entry / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            if parent == self.process.pid and b"worker process" in command and b"shutting" not in command:
                found.add(int(entry.name))
        return found

    def reload(self, timeout: float = START_TIMEOUT) -> None:
        """``nginx -s reload``, and wait until workers of the new configuration run (the old ones
        finish their requests meanwhile)."""
        before = self.workers()
        done = subprocess.run(
            nginx_command(self.binary, self.directory, "-s", "reload"), capture_output=True, timeout=timeout
        )
        if done.returncode != 0:
            raise NginxError(f"nginx -s reload failed: {done.stderr.decode(errors='replace').strip()}")
        deadline = time.monotonic() + timeout
        while True:
            now = self.workers()
            if now and not now & before:
                return
            if time.monotonic() > deadline:
                raise NginxError(f"nginx started no new workers: {self.said()}")
            time.sleep(0.05)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (nginx's fast shutdown), SIGKILL to the whole session past ``timeout``."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=timeout)
