"""The collapse detector on a real vLLM 0.32.0: traffic moves from temperature 0 to 1.5 (the tiny
Llama drafting for itself: every draft token accepted, then almost none), and the shipped pack's
``acceptance_collapse`` fires, sooner than its playbook rule ``acceptance_fallback``.

Both rules run as shipped, save the detector's warm-up (an hour, here 20 s of temperature-0
traffic) and its ``min_trials`` (one request in flight on two CPU cores drafts little). How long
each took, in seconds and in the daemon's scrape intervals, is printed with the tier's results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from specguard.config.loading import builtin_pack, load
from specguard.daemon.wiring import scrape_every
from tests.e2e.realclient import VllmServer, metrics_text, spec_counters, traffic_loop
from tests.processes import Daemon

pytestmark = pytest.mark.real

DETECTOR, PLAYBOOK = "acceptance_collapse", "acceptance_fallback"


def rules() -> dict[str, Any]:
    pack = yaml.safe_load(builtin_pack("speculative").read_text())
    kept = [rule for rule in pack["rules"] if rule["name"] in (DETECTOR, PLAYBOOK)]
    for rule in kept:
        if rule["name"] == DETECTOR:
            rule["detect"].update(warmup="20s", min_trials=20)
    return {"rules": kept}


def row(body: dict[str, Any], name: str) -> dict[str, Any] | None:
    rows = [r for r in body["rules"] if r["rule"] == name and r["labels"]]
    return rows[0] if len(rows) == 1 else None


async def test_acceptance_collapse_fires_before_the_playbook_rule_on_a_real_server(
    vllm_server: VllmServer,
    session: aiohttp.ClientSession,
    tmp_path: Path,
    unused_tcp_port: int,
    report: Callable[[str], None],
) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules(), sort_keys=False))
    config = tmp_path / "specguard.yaml"
    config.write_text(
        f"server: {{listen: 127.0.0.1, port: {unused_tcp_port}}}\nstate_dir: state\n"
        f"sources: {{scrape: {{targets: ['{vllm_server.metrics_url}'], timeout: 5s}}}}\n"
        "rules: [rules.yaml]\n"
    )
    loaded = load(config)
    assert loaded.ok, loaded.problems
    every = scrape_every(loaded)
    daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    before = spec_counters(await metrics_text(session, vllm_server.url))
    began = time.monotonic()
    daemon.start()
    try:
        # Bounded by time alone: a fast server must not run out of requests before the warm-up ends.
        async with traffic_loop(
            session, vllm_server.url, temperature=0, max_seconds=240, max_requests=10**6
        ) as cold:

            def warm(body: dict[str, Any]) -> bool:
                found = row(body, DETECTOR)
                return found is not None and found["verdict"] == "ok" and not found["detector"]["warming_up"]

            async def served() -> str:
                now = spec_counters(await metrics_text(session, vllm_server.url))
                return (
                    f"the traffic: {cold.requests} requests in {time.monotonic() - began:.0f} s; vLLM's "
                    f"counters moved by {now.drafts - before.drafts:.0f} drafts, "
                    f"{now.draft_tokens - before.draft_tokens:.0f} draft tokens, "
                    f"{now.accepted - before.accepted:.0f} accepted"
                )

            calibrated = await daemon.wait_for(warm, timeout=180, check=cold.check, explain=served)
        detector = row(calibrated, DETECTOR)
        assert detector is not None and detector["state"] == "inactive"
        switched = time.time()
        async with traffic_loop(session, vllm_server.url, temperature=1.5, max_seconds=420) as hot:

            def both_fired(body: dict[str, Any]) -> bool:
                rows = [row(body, DETECTOR), row(body, PLAYBOOK)]
                return all(r is not None and r["state"] == "firing" for r in rows)

            fired = await daemon.wait_for(both_fired, timeout=400, check=hot.check)
    finally:
        code = daemon.stop()
    collapse, fallback = row(fired, DETECTOR), row(fired, PLAYBOOK)
    assert collapse is not None and fallback is not None
    # When each one's firing began, as the daemon recorded it, against when the traffic turned.
    collapse_after, fallback_after = collapse["since"] - switched, fallback["since"] - switched
    report(
        f"temperature 0 -> 1.5: {DETECTOR} fired after {collapse_after:.1f} s "
        f"({collapse_after / every:.0f} scrape intervals of {every:g} s; G {collapse['value']:.1f} of h "
        f"{collapse['threshold']:.1f}, phi {collapse['detector']['phi']:.1f}, alpha0 "
        f"{collapse['detector']['in_control']:.3f}, last window alpha {collapse['detector']['window_alpha']:.3f}), "
        f"{PLAYBOOK} after {fallback_after:.1f} s ({fallback_after / every:.0f} scrape intervals)"
    )
    assert 0 < collapse_after < fallback_after
    # What the detector saw: acceptance fell past its deep level (a fall of 0.3 from 1.0 at temperature 0).
    assert collapse["detector"]["window_alpha"] < collapse["detector"]["in_control"] - 0.3
    assert code == 0
