"""The systemd side of sd_notify for tests: a real AF_UNIX datagram socket, as PID 1 binds for a
Type=notify unit, read by a thread that records each message with when it arrived."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Message:
    fields: dict[str, str]  # KEY=VALUE lines
    monotonic: float  # when it arrived
    wall: float
    seen: object = None  # what the receiver's hook returned on its arrival

    def __contains__(self, line: str) -> bool:
        key, _, value = line.partition("=")
        return self.fields.get(key) == value


@dataclass
class NotifySocket:
    address: str  # for $NOTIFY_SOCKET: a path, or @name in the abstract namespace
    messages: list[Message] = field(default_factory=list)
    # Called in the receiving thread the moment a message arrives, before the next is read.
    on_message: Callable[[dict[str, str]], object] | None = None

    def having(self, line: str) -> list[Message]:
        return [m for m in self.messages if line in m]

    def wait_for(self, line: str, timeout: float, after: int = 0) -> Message:
        """The first message from index ``after`` on that carries ``line``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for message in self.messages[after:]:
                if line in message:
                    return message
            time.sleep(0.02)
        raise AssertionError(f"no {line} within {timeout:.0f} s; got {[m.fields for m in self.messages]}")


@contextmanager
def notify_socket(directory: Path | None = None, abstract: str | None = None) -> Iterator[NotifySocket]:
    """A datagram socket at ``directory``/notify (or ``@abstract``), read until the block ends."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract is not None:
        sock.bind("\0" + abstract)
        address = "@" + abstract
    else:
        assert directory is not None
        path = directory / "notify"
        sock.bind(str(path))
        address = str(path)
    sock.settimeout(0.1)
    receiver = NotifySocket(address)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            arrived, wall = time.monotonic(), time.time()
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            seen = receiver.on_message(fields) if receiver.on_message is not None else None
            receiver.messages.append(Message(fields, arrived, wall, seen))

    thread = threading.Thread(target=read, name="notify-socket", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()
