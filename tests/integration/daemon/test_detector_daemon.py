"""`specguard run` with a `detect:` rule, in its own process, against a server whose speculative
counters move at every scrape: the CUSUM's statistic and calibration live in the store, so a
stopped or killed daemon goes on from them when it starts again instead of warming up for another
hour; a config whose interval changed warms up again and says why, once; and `specguard eval`
reads the running daemon's detector without writing to its database.

What the warm-up learns is the traffic's (phi is floored at 1 when its few windows happen to vary
less than binomial ones): the tests take phi and in_control as the daemon shows them and assert
only what it must do with them. The evidence is made by scrapes that all add the same drafts, at
an acceptance chosen from the learned one, so that each adds a Z known in advance, whatever the
warm-up learned and however the machine's timing cut the windows.
"""

from __future__ import annotations

import json
import math
import random
import signal
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specguard.common.sequential import llr, threshold
from specguard.sim.model import sample_accepted
from tests.processes import Daemon, specguard

K, DRAFTS = 3, 40  # a scrape's worth of work: 40 chain drafts of 3 tokens, about 90 trials
INTERVAL, DROP = 2.0, 0.15
RULES = """\
rules:
  - name: collapse
    signal: token_acceptance
    interval: {interval}
    detect: {{in_control: learn, drop: 0.15, false_alarm_every: 100000d, warmup: 10s, min_trials: 40}}
"""
H = threshold(100000 * 86400 / INTERVAL) + math.log(2)  # one level and the window test, 2 s windows


def falling_drafts(alpha: float) -> list[int]:
    """DRAFTS drafts' accepted tokens in the proportions a chain at per-position acceptance
    ``alpha`` has on average: DRAFTS alpha^j (1 - alpha) stop at their (j+1)-th token, the rest
    are accepted whole."""
    stopped = [round(DRAFTS * alpha**j * (1 - alpha)) for j in range(K)]
    return [j for j, count in enumerate(stopped) for _ in range(count)] + [K] * (DRAFTS - sum(stopped))


@dataclass(frozen=True)
class Fall:
    """Scrapes that make G climb by the same known step: each adds ``drafts``, and with them Z =
    ``z``, their log-likelihood ratio of the level to detect over in_control, divided by phi."""

    drafts: list[int]
    scrapes: int  # how many such scrapes make the evidence
    z: float


def fall_of(alpha0: float, phi: float) -> Fall:
    """Drafts below in_control ``alpha0`` by 0.11: under the CUSUM's reference value (about
    alpha0 - 0.07), so that every window of them makes G climb, and above the level alpha0 - 0.15,
    so that no window of them is one the window test can judge a collapse. As many scrapes as make
    G climb by about 3 in all, and at least 2 (at most 20): a scrape taken as an evaluation begins
    may fall between its window and the next, or in both, since each window ends when its
    evaluation begins. Even were each counted twice, G stays well short of h (for an in_control
    between 0.65 and 0.87, G climbs by 9 at most)."""
    drafts = falling_drafts(alpha0 - 0.11)
    successes = sum(drafts)
    failures = sum(1 for accepted in drafts if accepted < K)  # a rejection ends each of these
    z = llr(successes, failures, alpha0, alpha0 - DROP) / phi
    assert alpha0 - DROP < successes / (successes + failures) and z > 0, (alpha0, phi, drafts)
    return Fall(drafts, max(2, min(20, int(3 / z))), z)


class Drafting:
    """vLLM's speculative-decoding counters, moved at every scrape by DRAFTS drafts.

    In control, the drafts are accepted as the simulator accepts them
    (``sim.model.sample_accepted``), at an acceptance drawn for that scrape between ``low`` and
    ``high``: scrapes differ more than binomial ones, so phi is above 1 as a rule, yet it is 1 (its
    floor) when the warm-up's few windows happen to vary less. ``fall``: the next scrapes each add
    the same drafts, then the counters stand still. ``paused``: no traffic, the counters stand
    still."""

    def __init__(self) -> None:
        self.rng = random.Random(11)
        self.low, self.high = 0.7, 0.85
        self.paused = False
        self.falling: list[int] = []  # the drafts each of the next ``left`` scrapes adds
        self.left = 0
        self.still_since = 0.0  # when the last of them was served (time.time())
        self.accepted = self.drafts = 0
        self.per_position = [0] * K

    def fall(self, fall: Fall) -> None:
        self.falling, self.left = fall.drafts, fall.scrapes

    def _add(self, drafts: list[int]) -> None:
        for accepted in drafts:
            self.accepted += accepted
            self.drafts += 1
            for position in range(accepted):
                self.per_position[position] += 1

    def __call__(self) -> str:
        if self.left:
            self._add(self.falling)
            self.left -= 1
            if not self.left:
                self.paused, self.still_since = True, time.time()
        elif not self.paused:
            alpha = self.rng.uniform(self.low, self.high)
            self._add([sample_accepted(self.rng, [alpha] * K) for _ in range(DRAFTS)])
        labels = 'engine="0",model_name="m"'
        lines = [
            "# TYPE vllm:spec_decode_num_drafts counter",
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {self.drafts}",
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {self.drafts * K}",
            "# TYPE vllm:spec_decode_num_accepted_tokens counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {self.accepted}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {count}'
                for i, count in enumerate(self.per_position)
            ),
        ]
        return "\n".join(lines) + "\n"


async def serve(aiohttp_server: AiohttpServer, drafting: Drafting) -> str:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=drafting(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app, host="127.0.0.1")
    return f"http://127.0.0.1:{server.port}/metrics"


def write_config(directory: Path, port: int, target: str, interval: str = "2s") -> Path:
    (directory / "rules.yaml").write_text(RULES.format(interval=interval))
    config = directory / "specguard.yaml"
    config.write_text(
        f"server: {{port: {port}}}\nstate_dir: state\ninterval: 1s\nlog_level: info\n"
        f"sources: {{scrape: {{targets: [{target!r}], timeout: 5s}}}}\nrules: [rules.yaml]\n"
    )
    return config


def detector(body: dict[str, Any]) -> dict[str, Any] | None:
    rows = [r for r in body["rules"] if r["rule"] == "collapse" and r["labels"]]
    return rows[0]["detector"] if rows and rows[0].get("detector") else None


def stored(db: Path) -> dict[str, Any]:
    with sqlite3.connect(db) as connection:
        (row,) = connection.execute("SELECT detector FROM series_state WHERE rule = 'collapse'")
    value = json.loads(row[0])
    assert isinstance(value, dict)
    return value


async def at_rest(daemon: Daemon, since: float) -> dict[str, Any]:
    """The detector once every window with the counters' moves up to ``since`` (time.time(); still
    since then) has been judged: as shown after an evaluation without data whose window began after
    ``since``. That evaluation began after another one had ended, later than ``since`` plus the
    interval."""

    def no_data_after(b: dict[str, Any], t: float) -> bool:
        verdicts = [r["verdict"] for r in b["rules"] if r["rule"] == "collapse"]
        return (b["last_evaluation"] or 0) > t and verdicts == ["no_data"]

    first = await daemon.wait_for(lambda b: no_data_after(b, since + INTERVAL), 30)
    body = await daemon.wait_for(lambda b: no_data_after(b, first["last_evaluation"]), 30)
    state = detector(body)
    assert state is not None
    return state


async def calibrated_with_evidence(daemon: Daemon, drafting: Drafting) -> tuple[dict[str, Any], Fall]:
    """Warm-up done, then the counters still, then falling scrapes (``fall_of``), then still again:
    the detector's state as it stands still (windows without trials neither grow nor reset G), and
    the fall that made its evidence."""
    warmed = await daemon.wait_for(lambda b: (d := detector(b)) is not None and not d["warming_up"], 60)
    calibration = detector(warmed)
    assert calibration is not None
    phi, alpha0 = calibration["phi"], calibration["in_control"]
    # Whatever the warm-up's windows were: phi finite and at least 1, in_control an acceptance.
    assert isinstance(phi, int | float) and math.isfinite(phi) and phi >= 1, calibration
    assert isinstance(alpha0, int | float) and 0 < alpha0 < 1, calibration
    fall = fall_of(alpha0, phi)
    states: list[dict[str, Any]] = []
    for _ in range(3):
        drafting.paused = True
        await at_rest(daemon, time.time())  # in-control windows judged: the falling ones alone next
        drafting.fall(fall)
        await daemon.wait_for(lambda _: not drafting.left, 60)
        state = await at_rest(daemon, drafting.still_since)
        assert state["g"] < H, (state, fall)  # not an alarm: G climbed by a few at most
        assert (state["phi"], state["in_control"], state["warming_up"]) == (phi, alpha0, False), state
        if state["g"] > 0:  # evidence
            return state, fall
        states.append(state)  # no window judged a falling scrape
    raise AssertionError(f"no window judged the falling scrapes: {states}")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
async def test_the_statistic_and_its_calibration_go_on_across_a_restart(
    how: str, tmp_path: Path, unused_tcp_port: int, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    drafting = Drafting()
    config = write_config(tmp_path, unused_tcp_port, await serve(aiohttp_server, drafting))
    db = tmp_path / "state" / "specguard.db"
    daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    daemons.append(daemon)
    daemon.start()
    before, fall = await calibrated_with_evidence(daemon, drafting)

    daemon.stop(getattr(signal, how))
    kept = stored(db)
    assert (kept["g"], kept["phi"], kept["alpha0"]) == (before["g"], before["phi"], before["in_control"])
    daemon.start()
    restarted = time.time()
    body = await daemon.wait_for(lambda b: (b["last_evaluation"] or 0) > restarted + INTERVAL, 60)
    after = detector(body)
    assert after is not None
    assert (after["g"], after["phi"], after["in_control"]) == (
        before["g"],
        before["phi"],
        before["in_control"],
    )
    assert after["warming_up"] is False and after["warmup"] == "5/5 windows"
    # The calibration (its settings, the warm-up's sums, phi and in_control) and the statistic as
    # they were stored before the stop.
    carried = ("calibration", "warmup", "phi", "alpha0", "g", "gs")
    assert {k: stored(db)[k] for k in carried} == {k: kept[k] for k in carried}

    # While it runs, eval steps its detector on from the state it keeps (no traffic: G as it is).
    code, out, err = await specguard(
        "eval", "--once", "--config", str(config), "--rule", "collapse", "--sample-gap", "0.5"
    )
    assert code == 0, err
    line = out.splitlines()[-1]
    assert line.startswith(
        f"collapse: CUSUM G {before['g']:.4g} of h {H:.4g}; phi {before['phi']:.4g}; acceptance "
        f"{before['in_control']:.4g} -> {before['in_control'] - DROP:.4g}; last window "
    ), line

    # The falling scrapes again: G climbs from where it was, never warming up first, each window by
    # its scrapes' Z with the stored phi and in_control.
    seen: list[dict[str, Any]] = []

    def falling(b: dict[str, Any]) -> bool:
        if (d := detector(b)) is not None:
            seen.append(d)
        return not drafting.left

    for _ in range(3):
        drafting.fall(fall)
        await daemon.wait_for(falling, 60)
        seen.append(await at_rest(daemon, drafting.still_since))
        if seen[-1]["g"] != before["g"]:
            break
    assert [d["warming_up"] for d in seen] == [False] * len(seen)
    assert {d["phi"] for d in seen} == {before["phi"]}
    scrapes = (seen[-1]["g"] - before["g"]) / fall.z  # how many falling scrapes were judged
    assert round(scrapes) >= 1 and math.isclose(scrapes, round(scrapes), abs_tol=1e-6), (seen[-1], fall)
    assert daemon.stop() == 0
    assert not [e for e in daemon.logs() if "warms up again" in e.get("msg", "")]


async def test_a_reload_with_another_interval_warms_up_again_and_says_why_once(
    tmp_path: Path, unused_tcp_port: int, aiohttp_server: AiohttpServer, daemons: list[Daemon]
) -> None:
    drafting = Drafting()
    target = await serve(aiohttp_server, drafting)
    config = write_config(tmp_path, unused_tcp_port, target)
    daemon = Daemon(config, unused_tcp_port, tmp_path / "specguard.log")
    daemons.append(daemon)
    daemon.start()
    await calibrated_with_evidence(daemon, drafting)
    drafting.paused = False  # in control again

    write_config(tmp_path, unused_tcp_port, target, interval="4s")  # phi was measured on 2 s windows
    daemon.signal(signal.SIGHUP)
    # Calibrated until now: the first state warming up is the new warm-up's.
    body = await daemon.wait_for(lambda b: (d := detector(b)) is not None and d["warming_up"], 30)
    again = detector(body)
    assert again is not None and again["warmup"] in ("0/3 windows", "1/3 windows", "2/3 windows")
    assert (again["g"], again["phi"], again["in_control"]) == (0.0, None, None)
    await daemon.wait_for(lambda b: (d := detector(b)) is not None and d["warmup"] == "3/3 windows", 60)
    assert daemon.stop() == 0
    said = [e for e in daemon.logs() if "warms up again" in e.get("msg", "")]
    assert len(said) == 1, said
    assert said[0]["level"] == "warning" and said[0]["rule"] == "collapse"
    assert said[0]["msg"].startswith(
        'collapse: series {"instance":"' + target.removeprefix("http://").removesuffix("/metrics")
    )
    assert said[0]["msg"].endswith(
        "warms up again: the interval changed from 2s to 4s, so its phi and in_control were measured "
        "on other windows"
    )
