"""The demo's scenario: its constants and timeline, and the files it sets up in its directory (the
shipped rules with shortened windows, specguard's config with the ``routing:`` section of its two
simulators when nginx routes, the routers' flag files, the Slack token, and the latency baseline
measured on the healthy traffic)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from specguard.config.loading import builtin_pack
from specguard.daemon.runtime import Daemon
from specguard.demo.report import MODEL
from specguard.rules.durations import format_duration, parse_duration
from specguard.rules.signals import get_signal
from specguard.sim.slack_api import TOKEN, SlackApi

SPEEDUP = 20  # the shipped rules' windows and durations are divided by this
HEALTHY_TEMPERATURE = 0.0
HOT_TEMPERATURE = 1.5
CHANNEL = "C0DEMO0NCALL"
FALLBACK_RULE = "acceptance_fallback"
DETECTOR_RULE = "acceptance_collapse"
DETECTOR_WARMUP = 10.0  # seconds of healthy traffic the detector calibrates on
FLAG_FILE = "flag.json"  # the demo's own router's
ROUTING_FLAG_FILE = "routing-flag.json"  # nginx's: read when it starts; the fallback writes both it and nginx
# The simulated draft's cost per step against the target's (c): a small draft model's. With it,
# healthy speculation is about twice as fast as standard decoding and collapsed speculation about a
# third slower, so the fallback shows in the latency clients see.
DRAFT_COST = 0.15


@dataclass(frozen=True)
class Timeline:
    """When things happen, in seconds from the start (or from the step before)."""

    baseline_at: float = 14.0
    degrade_at: float = 18.0
    calm_after: float = 5.0  # the temperature returns to normal this long after traffic moved away
    quiet_period: float = 8.0  # the fallback's: resolved this long before the canary and restore
    linger: float = 4.0  # after the loop has closed, to show traffic back on speculation
    calibration_wait: float = 30.0  # the drop waits this long at most for the detector's calibration
    deadline: float = 110.0  # stop here even if the loop has not closed
    pulse_every: float = 5.0


def scaled_rules(factor: int) -> dict[str, Any]:
    """The shipped pack with every window and duration divided by ``factor``; the fallback rule
    engages the flag and tells on-call, and resolves once its server has no traffic to judge."""
    pack = yaml.safe_load(builtin_pack("speculative").read_text())
    for rule in pack["rules"]:
        for key in ("window", "for", "keep_firing_for", "interval"):
            if key in rule:
                seconds = max(1.0, parse_duration(rule[key]) / factor)
                rule[key] = format_duration(seconds)
        if rule["name"] == FALLBACK_RULE:
            rule["actions"] = ["log", "fallback", "oncall"]
            rule["no_data"] = "ok"
        if rule["name"] == DETECTOR_RULE:
            # Its hour of warm-up, shortened to the demo's healthy seconds; it only logs, beside
            # the playbook rule that drives the fallback, to show how much sooner it sees the drop.
            rule["detect"]["warmup"] = format_duration(DETECTOR_WARMUP)
            rule["detect"]["min_trials"] = 20
    return dict(pack)


def routing_section(
    directory: Path, speculative: str, standard: str, listen: int, admin: int
) -> dict[str, Any]:
    """The ``routing:`` section for the demo's simulators (``host:port`` each) on loopback ports.
    Its one class (short completions to standard decoding) shows where classes go; the demo's
    traffic (64 tokens) matches none of them and goes to the speculative pool, so that its
    temperature reaches the speculative server and the fallback flag is what moves it."""
    return {
        "listen": f"127.0.0.1:{listen}",
        "admin_listen": f"127.0.0.1:{admin}",
        "flag_file": str(directory.resolve() / ROUTING_FLAG_FILE),
        "pools": {
            "speculative": {"servers": [speculative], "keepalive": 8},
            "standard": {"servers": [standard], "keepalive": 8},
        },
        "default_pool": "speculative",
        "fallback_pool": "standard",
        "classes": [{"name": "short", "pool": "standard", "when": {"max_tokens": {"lt": 32}}}],
        "read_timeout": 60,
    }


def fallback_backend(directory: Path, routing: dict[str, Any] | None) -> dict[str, Any]:
    """The ``feature_flag`` action's backend: nginx's flag when nginx routes, the demo's flag file
    otherwise."""
    if routing is not None:
        return {
            "nginx": {"admin_url": f"http://{routing['admin_listen']}", "flag_file": routing["flag_file"]}
        }
    return {"file": {"path": FLAG_FILE, "engage": {"speculative": False}, "restore": {"speculative": True}}}


def write_config(
    directory: Path,
    spec_url: str,
    slack: SlackApi,
    quiet: float,
    baseline: bool,
    routing: dict[str, Any] | None = None,
) -> Path:
    """specguard's config for the demo in ``directory``: the scrape of the speculative server, the
    fallback (``quiet`` its quiet period, its canary on that server; nginx's flag with ``routing``,
    the flag file otherwise) and on-call in Slack; with the measured baseline when ``baseline``."""
    config: dict[str, Any] = {
        "server": {"port": 0},
        "interval": "1s",
        "state_dir": ".",
        "sources": {"scrape": {"targets": [f"{spec_url}/metrics"], "timeout": "2s"}},
        "rules": ["rules.yaml"],
        "actions": {
            "fallback": {
                "type": "feature_flag",
                **fallback_backend(directory, routing),
                "quiet_period": format_duration(quiet),
                "canary": {
                    "url": spec_url,
                    "min_acceptance": 0.5,
                    "requests": 4,
                    "max_tokens": 32,
                    "temperature": HEALTHY_TEMPERATURE,
                    "timeout": "20s",
                },
                "restore_backoff": "4s",
            },
            "oncall": {
                "type": "slack",
                "token": {"file": "slack-token"},
                "channel": CHANNEL,
                "base_url": slack.url,
                "group_wait": "2s",
            },
        },
    }
    if baseline:
        config["baseline"] = "baseline.json"
    if routing is not None:
        config["routing"] = routing
    path = directory / "specguard.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def measure_baseline(daemon: Daemon, directory: Path, window: float, draft_cost: float) -> float | None:
    """The e2e latency p95 and mean the daemon reads over the last ``window`` seconds, written to
    baseline.json with the draft's cost; the p95, or None while there is no latency data."""
    signals: dict[str, float] = {}
    for name in ("e2e_latency_p95", "e2e_latency_mean"):  # what latency_regression and _mean_ read
        result = await daemon.source.query_signal(get_signal(name), window, ())
        if not result.series or result.series[0].value is None:
            return None
        signals[name] = result.series[0].value
    value = signals["e2e_latency_p95"]
    baseline = {
        "version": 2,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "method": f"specguard demo: e2e p95 and mean over {window:g}s of healthy simulated traffic",
        "entries": [
            {
                "model": MODEL,
                "signals": signals,
                "signals_from": "vllm_metrics",  # the daemon's own reading of vLLM's histogram
                # The simulated draft's cost per step, as the simulator was told (--draft-cost).
                "speculative": {"method": "draft_model", "draft_cost": draft_cost},
            }
        ],
    }
    (directory / "baseline.json").write_text(json.dumps(baseline, indent=2) + "\n")
    return value


def prepare(directory: Path) -> None:
    """The demo's directory, with the Slack token and the shortened rules."""
    directory.mkdir(parents=True, exist_ok=True)
    token = directory / "slack-token"  # the bot token, read from a file as in production
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    (directory / "rules.yaml").write_text(yaml.safe_dump(scaled_rules(SPEEDUP), sort_keys=False))


def write_flag(directory: Path, nginx: bool) -> Path:
    """The router's flag file as a deploy would leave it, speculative decoding on: nginx's
    (``fallback: false``) or the demo's own router's (``speculative: true``)."""
    if nginx:
        path, value = directory / ROUTING_FLAG_FILE, {"fallback": False}
    else:
        path, value = directory / FLAG_FILE, {"speculative": True}
    path.write_text(json.dumps(value) + "\n")
    return path
