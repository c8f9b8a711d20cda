"""The demo's drop waits for its collapse detector to calibrate on the healthy traffic (up to a
bound), so that on a loaded machine, where the warm-up's windows come late, the drop does not land
inside the warm-up. The detector's state is made by the real judging, window by window."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specguard.config.loading import load
from specguard.demo.calibration import wait_calibrated
from specguard.demo.scenario import DETECTOR_RULE, prepare, write_config
from specguard.engine.detection import judge
from specguard.sources.base import Series, SourceResult
from specguard.store.records import SeriesState

INSTANCE = "127.0.0.1:8000"
LABELS = {"instance": INSTANCE, "model_name": "tiny-llama"}


def _daemon(tmp_path: Path) -> Any:
    prepare(tmp_path)
    slack: Any = SimpleNamespace(url="http://127.0.0.1:9/api/")  # its address is all the config takes
    config = write_config(tmp_path, f"http://{INSTANCE}", slack, 8.0, False)
    loaded = load(config)
    assert loaded.ok, loaded.errors
    return SimpleNamespace(loaded=loaded, states={DETECTOR_RULE: {}})


def _step(daemon: Any, now: float, rng: random.Random, alpha: float = 0.8) -> None:
    """One window of token acceptance judged by the detector, its state kept as the daemon keeps it."""
    (item,) = [i for i in daemon.loaded.enabled_rules() if i.name == DETECTOR_RULE]
    interval = item.rule.interval or daemon.loaded.config.interval
    trials = 400.0
    value = sum(rng.random() < alpha for _ in range(int(trials))) / trials
    answer = SourceResult(series=(Series(LABELS, value, trials),))
    previous = daemon.states[DETECTOR_RULE]
    judged = judge(item.rule.detect, interval, answer, previous, None, now)
    for key, detector in judged.detectors.items():
        daemon.states[DETECTOR_RULE][key] = SeriesState(LABELS, detector=detector)


async def test_the_drop_waits_until_the_detector_has_calibrated(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    rng = random.Random(3)
    for second in range(4):  # four of its ten windows in: still warming up
        _step(daemon, 1000.0 + second, rng)

    async def the_rest_late() -> None:  # the other windows, one every 0.1 s
        for second in range(4, 10):
            await asyncio.sleep(0.1)
            _step(daemon, 1000.0 + second, rng)

    feeding = asyncio.create_task(the_rest_late())
    result = await wait_calibrated(daemon, DETECTOR_RULE, INSTANCE, 30.0, asyncio.Event())
    await feeding
    assert result.calibrated
    assert result.waited >= 0.5  # it waited for the sixth window, not only the first
    shown = re.fullmatch(
        r"calibrated on the healthy traffic: in_control (0\.\d+) \(warm-up\), phi [\d.]+", result.text
    )
    assert shown and abs(float(shown[1]) - 0.8) < 0.02, result.text  # the level it was fed


async def test_a_calibrated_detector_lets_the_drop_go_at_once(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    rng = random.Random(4)
    for second in range(10):
        _step(daemon, 1000.0 + second, rng)
    result = await wait_calibrated(daemon, DETECTOR_RULE, INSTANCE, 30.0, asyncio.Event())
    assert result.calibrated and result.waited < 0.2, result


async def test_after_the_bound_it_says_where_the_warm_up_stands(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    rng = random.Random(5)
    for second in range(3):
        _step(daemon, 1000.0 + second, rng)
    result = await wait_calibrated(daemon, DETECTOR_RULE, INSTANCE, 0.3, asyncio.Event())
    assert not result.calibrated and result.waited >= 0.3
    assert result.text == "warming up, 3/10 windows"
    other = await wait_calibrated(daemon, DETECTOR_RULE, "127.0.0.1:1", 0.0, asyncio.Event())
    assert not other.calibrated and other.text == "no window with enough draft tokens yet"


async def test_a_stop_ends_the_wait(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    result = await wait_calibrated(daemon, DETECTOR_RULE, INSTANCE, 30.0, stop)
    assert not result.calibrated and result.waited < 5.0
