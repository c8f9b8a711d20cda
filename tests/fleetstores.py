"""A real etcd and a real Redis (the Debian packages) on loopback, for the tests of fleet
coordination: started unprivileged in a directory of their own on free ports, and stopped, paused
(SIGSTOP: the store hangs, connections stay open), resumed (SIGCONT), and started again on the same
port and directory, for "the store stopped mid-wave" tests. Missing binary: skip, or fail under
SPECGUARD_REQUIRE_REAL=1 (tests/real.py).

etcd keeps its data across a restart (its data directory); this Redis keeps none (``--save ''
--appendonly no``): started again, it is empty.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import pytest

from tests.ports import free_port
from tests.real import require_binary

READY_TIMEOUT = 30.0


class StoreServer:
    """One store process; ``start`` waits until it answers, ``stop`` until it has exited."""

    name = ""

    def __init__(self, binary: str, directory: Path, port: int) -> None:
        self.binary, self.directory, self.port = binary, directory, port
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log = directory / f"{self.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def url(self) -> str:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        assert self.process is None, f"{self.name} already running"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, self.process = self.process.returncode, None
                pytest.fail(f"{self.name} exited with {code}:\n{self.tail()}")
            if self.ready():
                return
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"{self.name} not ready after {READY_TIMEOUT:g}s:\n{self.tail()}")

    def stop(self) -> None:
        """Stop it (a paused one too) and reap it; killed if it does not stop in 10 s."""
        process, self.process = self.process, None
        if process is None:
            return
        if self.paused:
            self.resume_process(process)
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        """Stopped and started again on the same port and directory."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the process holds its port and its connections but answers nothing."""
        assert self.process is not None and not self.paused
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None and self.paused
        self.resume_process(self.process)

    def resume_process(self, process: subprocess.Popen[bytes]) -> None:
        os.kill(process.pid, signal.SIGCONT)
        self.paused = False

    def tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class EtcdServer(StoreServer):
    """A one-member etcd cluster: client port ``port``, peer port ``peer``."""

    name = "etcd"

    def __init__(self, binary: str, directory: Path, port: int, peer: int) -> None:
        super().__init__(binary, directory, port)
        self.peer = peer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer}"
        return [
            self.binary,
            "--name", "x",
            "--data-dir", str(self.directory / "data"),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"x={peer}",
            "--logger", "zap",
            "--log-level", "warn",
        ]  # fmt: skip

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer:
                return bool(json.loads(answer.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False


class RedisServer(StoreServer):
    """A Redis without persistence on 127.0.0.1:``port``; ``extra``: more options (--requirepass)."""

    name = "redis"

    def __init__(self, binary: str, directory: Path, port: int, extra: Sequence[str] = ()) -> None:
        super().__init__(binary, directory, port)
        self.extra = list(extra)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--logfile", str(self.log),
            *self.extra,
        ]  # fmt: skip

    def ready(self) -> bool:
        """It answers a PING (+PONG, or -NOAUTH when it wants a password: up all the same)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                answer = sock.recv(64)
        except OSError:
            return False
        return answer.startswith((b"+PONG", b"-NOAUTH"))


def etcd_server(directory: Path) -> EtcdServer:
    """An etcd (not started) in ``directory`` on free loopback ports."""
    return EtcdServer(require_binary("etcd", "etcd-server"), directory, free_port(), free_port())


def redis_server(directory: Path, extra: Sequence[str] = ()) -> RedisServer:
    """A Redis (not started) in ``directory`` on a free loopback port."""
    return RedisServer(require_binary("redis-server", "redis-server"), directory, free_port(), extra)
