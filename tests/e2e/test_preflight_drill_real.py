"""The fallback drill (``specguard preflight --drill``, item 7) on the real stack: the real vLLM
with speculative decoding (the session's server) behind specguard's real nginx router, the standard
pool a simulated vLLM without speculation serving the same model name (a second real vLLM would not
fit this machine's two cores), the ``feature_flag`` action's ``nginx`` backend, and its canary on
the real server.

The drill passes: its probes go to the real server, then to the standard pool while the flag is
engaged, the canary reads the real server's acceptance, the flag is restored and the probes go back.
A canary asking more than the server gives at a temperature of 1.5 fails the drill, and the drill
still restores the flag and records it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specguard.preflight.item import Status
from specguard.sim.options import SimOptions
from specguard.sim.server import start_simulator
from tests.drill_stack import drill_stack
from tests.e2e.realclient import SERVED_NAME, VllmServer
from tests.nginx_router import require_nginx
from tests.ports import free_port


async def test_the_drill_on_the_real_stack_moves_traffic_and_restores_it_through_the_canary(
    vllm_server: VllmServer, tmp_path: Path, report: Callable[[str], None]
) -> None:
    require_nginx()
    standard = await start_simulator(SimOptions(model=SERVED_NAME, port=free_port(), step_time=0.002, seed=5))
    try:
        async with drill_stack(
            tmp_path, f"127.0.0.1:{vllm_server.port}", f"127.0.0.1:{standard.options.port}"
        ) as world:
            canary = {"url": vllm_server.url, "min_acceptance": 0.5, "requests": 2, "max_tokens": 32}
            world.write(canary=canary, drill={"timeout": "60s"})
            served = len(standard.ground_truth())
            answer = await world.check()
            assert answer.status is Status.PASS, answer
            said = "\n".join(answer.evidence)
            assert "answered 200 by pool speculative (class default)" in said  # the real server, before
            assert "engaged: 3 probe(s) answered 200 by pool standard" in said
            assert "restored: 3 probe(s) answered 200 by pool speculative" in said
            assert len(standard.ground_truth()) >= served + 3
            assert not await world.engaged() and world.flag_file_says() == {"fallback": False}
            (row,) = world.drills()
            assert row["outcome"] == "passed"
            canary_line = next(
                line for line in answer.evidence if line.startswith("the canary would restore")
            )
            report(f"drill passed in {row['finished'] - row['started']:.1f} s; {canary_line}")

            # the canary at a temperature where the real draft's tokens are rarely accepted
            hot = {**canary, "temperature": 1.5, "min_acceptance": 0.9, "requests": 4, "max_tokens": 64}
            world.write(canary=hot, drill={"timeout": "60s"})
            answer = await world.check()
            assert answer.status is Status.FAIL
            last = world.drills()[-1]
            assert last["outcome"] == "failed", last
            assert last["detail"].startswith("the canary would keep the fallback: canary: acceptance ")
            assert last["detail"].endswith("below 0.9")
            assert not await world.engaged() and world.flag_file_says() == {"fallback": False}
            assert last["evidence"][-1].startswith("restored on the way out: speculative decoding restored")
            report(f"drill at temperature 1.5: {last['detail']}")
    finally:
        await standard.stop()
