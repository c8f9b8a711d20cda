"""The daemon's own metrics, on its /metrics endpoint (a private registry, never the global one)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specguard.actions.base import Holding
from specguard.store.baseline import Baseline
from specguard.store.records import State


class DaemonMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.evaluations = Counter(
            "specguard_evaluations",
            "Series evaluations by rule and verdict",
            ["rule", "result"],
            registry=r,
        )
        self.rule_series = Gauge(
            "specguard_rule_series",
            "Series of each rule in each state",
            ["rule", "state"],
            registry=r,
        )
        self.source_errors = Counter(
            "specguard_source_errors",
            "Failed source queries or scrapes, by source and target (the scrape target's instance)",
            ["source", "target"],
            registry=r,
        )
        self.scrapes_skipped = Counter(
            "specguard_scrapes_skipped",
            "Scrape rounds skipped because the previous one (a slow target) was still running",
            registry=r,
        )
        self.connections_evicted = Counter(
            "specguard_http_connections_evicted",
            "Connections to specguard's own HTTP server closed to stay under its connection cap",
            registry=r,
        )
        self.connections_peak = Gauge(
            "specguard_http_connections_peak",
            "Most connections specguard's own HTTP server held at once since it started",
            registry=r,
        )
        self.store_errors = Counter(
            "specguard_store_errors",
            "Writes to the state store that failed (a full disk, a read-only file system)",
            registry=r,
        )
        self.evaluation_duration = Histogram(
            "specguard_evaluation_duration_seconds",
            "Time one evaluation round took",
            ["interval"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.overruns = Counter(
            "specguard_evaluation_overruns",
            "Evaluation rounds skipped because the previous round was still running or late",
            ["interval"],
            registry=r,
        )
        self.events = Counter("specguard_events", "State transitions", ["rule", "kind"], registry=r)
        self.action_runs = Counter(
            "specguard_action_runs",
            "Action runs by action and status",
            ["action", "status"],
            registry=r,
        )
        self.config_reloads = Counter(
            "specguard_config_reloads", "Config reloads by result", ["result"], registry=r
        )
        self.webhook_deliveries = Counter(
            "specguard_webhook_deliveries",
            "Alertmanager webhook deliveries by outcome: stored (new alert states), duplicate (all "
            "known), unauthorized, bad_request, too_large, store_failing",
            ["outcome"],
            registry=r,
        )
        self.webhook_alerts = Counter(
            "specguard_webhook_alerts",
            "Alerts in accepted webhook deliveries, by status",
            ["status"],
            registry=r,
        )
        self.webhook_duplicates = Counter(
            "specguard_webhook_duplicate_alerts",
            "Alert states received again (same fingerprint, status and startsAt) and not acted on again",
            registry=r,
        )
        self.webhook_truncated = Counter(
            "specguard_webhook_truncated_alerts",
            "Alerts Alertmanager left out of deliveries (its max_alerts), from truncatedAlerts",
            registry=r,
        )
        self.webhook_seconds = Histogram(
            "specguard_webhook_handling_seconds",
            "Time from a webhook request to its answer (the delivery stored, or refused)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.last_evaluation = Gauge(
            "specguard_last_evaluation_timestamp_seconds",
            "When the last round finished",
            registry=r,
        )
        # What the actions hold in the world: one gauge per field of Holding, by its name.
        self.holdings: dict[str, Gauge] = {
            "fallback_engaged": Gauge(
                "specguard_fallback_engaged",
                "1 while a feature_flag action's fallback to standard decoding is engaged, 0 otherwise",
                ["action"],
                registry=r,
            ),
            "speculative_tokens": Gauge(
                "specguard_speculative_tokens",
                "num_speculative_tokens of a vllm_restart action's vLLM as last verified (before any "
                "change: as its config file says); 0 is speculative decoding off",
                ["action"],
                registry=r,
            ),
        }
        self.failing = Gauge(
            "specguard_action_failing",
            "How much of an action's work is failing now: a notifier's notices failed for good, a "
            "feature_flag's writes failed in a row (0: none)",
            ["action"],
            registry=r,
        )
        self.baseline = Gauge(
            "specguard_baseline",
            "The loaded baseline file's values by entry and signal (model_name, instance: empty when "
            "the entry names none)",
            ["model_name", "instance", "signal"],
            registry=r,
        )

    def show_holding(self, action: str, holding: Holding | None) -> None:
        """``action`` holds ``holding`` now; None: the action is gone (its gauges go too)."""
        for field, gauge in self.holdings.items():
            value = None if holding is None else getattr(holding, field)
            if value is None:
                with contextlib.suppress(KeyError):  # never shown (older prometheus_client raises)
                    gauge.remove(action)
            else:
                gauge.labels(action).set(float(value))

    def show_failing(self, action: str, count: float | None) -> None:
        """``count`` of the action's work is failing now; None: the action is gone (its gauge too)."""
        if count is None:
            with contextlib.suppress(KeyError):
                self.failing.remove(action)
        else:
            self.failing.labels(action).set(count)

    def show_rules(self, rules: Iterable[str]) -> None:
        """Export each rule's event counters from 0, one per state an event enters: a counter that
        first appears at 1 is an increase Prometheus never sees (increase() over it reads 0)."""
        for rule in rules:
            for state in State:
                self.events.labels(rule, state.value)

    def show_baseline(self, baseline: Baseline | None) -> None:
        """The values of the baseline now loaded, in place of the previous file's."""
        self.baseline.clear()
        for entry in baseline.entries if baseline is not None else ():
            for signal, value in entry.signals.items():
                self.baseline.labels(entry.model or "", entry.instance or "", signal).set(value)
