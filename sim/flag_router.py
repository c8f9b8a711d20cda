"""The demo's flag router: which server a request goes to, from a feature-flag file, read as a
real router reads it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


class FlagRouter:
    """Which server a request goes to, from the flag file, read the way a router reads it: looked
    at before each request, parsed again when it changed, the last good reading kept when it
    cannot be read."""

    def __init__(
        self, path: Path, speculative: str, standard: str, on_change: Callable[[bool, str], None]
    ) -> None:
        self.path = path
        self.servers = {True: speculative, False: standard}
        self.on_change = on_change
        self.speculative = True
        self._seen: tuple[int, int] | None = None

    def __call__(self) -> str:
        try:
            stat = self.path.stat()
            seen = (stat.st_mtime_ns, stat.st_size)
            if seen != self._seen:
                self._seen = seen
                value = bool(json.loads(self.path.read_text()).get("speculative", True))
                if value != self.speculative:
                    self.speculative = value
                    self.on_change(value, self.servers[value])
        except (OSError, ValueError, AttributeError):
            pass  # a router keeps its last good reading
        return self.servers[self.speculative]
