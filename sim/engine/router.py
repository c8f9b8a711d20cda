"""Which data-parallel engine takes a request: vLLM 0.32's internal load balancer, for one API server.

``DPLBAsyncMPClient.get_core_engine_for_request`` (``vllm/v1/engine/core_client.py``) scores each
engine as the larger of its in-flight requests and waiting + running, plus a penalty for a queue on
an engine whose KV cache is over half full (``waiting * 6 * (usage - 0.5)``), takes the lowest
score, and starts each scan one engine further on so that ties do not always favour engine 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from specguard.sim.engine.engine import Engine


class Router:
    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("a router needs at least one engine")
        self.engines = list(engines)
        self._start = 0

    def pick(self) -> Engine:
        count = len(self.engines)
        best, best_score = self.engines[0], float("inf")
        for offset in range(count):
            engine = self.engines[(self._start + offset) % count]
            waiting = engine.num_waiting
            score = float(max(engine.num_unfinished, waiting + engine.num_running))
            if waiting:
                score += waiting * 6.0 * max(0.0, engine.kv_usage() - 0.5)
            if score < best_score:
                best, best_score = engine, score
        self._start = (self._start + 1) % count
        return best
