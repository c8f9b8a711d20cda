"""Item 9: Prometheus scrapes vLLM and specguard (``up`` is 1 for each), has loaded the rules
``specguard export prometheus-rules`` writes now (its rules API: the groups and their alerts; the
rules file, when ``preflight.prometheus.rules_file`` names it, as a fresh export writes it), and the
Grafana dashboard file (``preflight.prometheus.grafana_dashboard``) is current with the signal
catalog (``preflight.dashboard``).

Without a Prometheus URL (``preflight.prometheus.url``, else ``sources.prometheus.url``) or a
dashboard file, those parts are unknown: which Prometheus or which dashboard is not for this host
to guess. vLLM's servers are the config's scrape targets (``history.scrape`` with the Prometheus
source); with neither, every target of a job that has vLLM's series."""

from __future__ import annotations

from collections import Counter
from typing import Any

from specguard.preflight.item import Answer, Context, Status
from specguard.preflight.prometheus_api import LoadedGroup, Up

NUMBER = 9
KEY = "prometheus"
TITLE = "Prometheus scrapes, rules loaded, dashboard current"

RANK = {Status.PASS: 0, Status.UNKNOWN: 1, Status.FAIL: 2}
WILDCARD = ("", "0.0.0.0", "::", "*")


def _split(address: str) -> tuple[str, int | None]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else None


def _same(instance: str, host: str, port: int) -> bool:
    """Whether Prometheus's ``instance`` is ``host:port`` (any host for a wildcard listen address,
    any loopback one for a loopback address)."""
    from specguard.common.addresses import is_loopback

    theirs, their_port = _split(instance)
    if their_port != port:
        return False
    return host in WILDCARD or theirs == host or (is_loopback(theirs) and is_loopback(host))


def _targets(ctx: Context, up: list[Up], vllm_jobs: set[str]) -> tuple[Status, list[str]]:
    from specguard.sources.targets import instance_label

    config = ctx.loaded.config
    scrape = config.history.scrape or (config.scrape if config.sources.kind == "scrape" else None)
    wanted: list[tuple[str, str, int | None]] = []  # (what, host, port)
    if scrape is not None:
        for url in scrape.urls:
            host, port = _split(instance_label(url))
            wanted.append((f"vLLM {url}", host, port))
    wanted.append((f"specguard's /metrics ({config.server.listen}:{config.server.port})",
                   config.server.listen, config.server.port))  # fmt: skip
    lines: list[str] = []
    status = Status.PASS
    for what, host, port in wanted:
        found = [u for u in up if port is not None and _same(u.instance, host, port)]
        if not found:
            status = Status.FAIL
            lines.append(f"{what}: Prometheus does not scrape it (no up series for {host}:{port})")
        for series in found:
            state = "up" if series.value == 1 else f"down: {series.error or 'up = 0'}"
            lines.append(
                f"{what}: up{{job={series.job!r}, instance={series.instance!r}}} = {series.value:g} ({state})"
            )
            if series.value != 1:
                status = Status.FAIL
    if scrape is None:
        jobs = sorted(vllm_jobs)
        vllm = [u for u in up if u.job in vllm_jobs]
        if not vllm:
            status = Status.FAIL
            lines.append("no job of Prometheus has vLLM's series (vllm:*)")
        for series in vllm:
            lines.append(f"vLLM (job {series.job}): up{{instance={series.instance!r}}} = {series.value:g}"
                         + ("" if series.value == 1 else f" (down: {series.error or 'up = 0'})"))  # fmt: skip
            if series.value != 1:
                status = Status.FAIL
        lines.insert(0, f"vLLM's servers: the targets of job(s) {', '.join(jobs) or '(none)'}")
    return status, lines


def _exported(ctx: Context) -> tuple[list[dict[str, Any]], int]:
    """The groups ``specguard export prometheus-rules`` writes now, and its alerting rules' count."""
    import yaml

    from specguard import __version__
    from specguard.export.prometheus_rules import export_rules

    result = export_rules(ctx.loaded, __version__)
    return list((yaml.safe_load(result.text) or {}).get("groups") or []), result.alerting_rules


def _rules(groups: list[dict[str, Any]], loaded: list[LoadedGroup]) -> tuple[Status, list[str]]:
    lines: list[str] = []
    status = Status.PASS
    names = {g["name"] for g in groups}
    for group in groups:
        wanted = Counter(str(r["alert"]) for r in group["rules"])
        theirs = [g for g in loaded if g.name == group["name"]]
        if not theirs:
            status = Status.FAIL
            lines.append(f"group {group['name']} ({sum(wanted.values())} alerts): not loaded")
            continue
        have = Counter(a for g in theirs for a in g.alerts)
        missing, stale = wanted - have, have - wanted
        files = ", ".join(sorted({g.file for g in theirs}))
        if missing or stale:
            status = Status.FAIL
            said = [f"missing {', '.join(sorted(missing))}" if missing else "",
                    f"not in a fresh export {', '.join(sorted(stale))}" if stale else ""]  # fmt: skip
            lines.append(f"group {group['name']} (from {files}): " + "; ".join(s for s in said if s))
        else:
            lines.append(f"group {group['name']}: its {sum(wanted.values())} alerts loaded (from {files})")
        for bad in (b for g in theirs for b in g.unhealthy):
            status = Status.FAIL
            lines.append(f"group {group['name']}: Prometheus cannot evaluate {bad}")
    for extra in loaded:
        if extra.name.startswith("specguard-") and extra.name not in names:
            status = Status.FAIL
            lines.append(
                f"group {extra.name} (from {extra.file}): loaded, but a fresh export has no such group"
            )
    if not groups:
        lines.append("no rule is exported: Prometheus has nothing of specguard's to load")
    return status, lines


def _rules_file(ctx: Context, groups: list[dict[str, Any]]) -> tuple[Status, list[str]]:
    import yaml

    path = ctx.loaded.config.preflight.prometheus.rules_file
    if path is None:
        return Status.PASS, []
    try:
        theirs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("groups") or []
    except (OSError, ValueError, yaml.YAMLError, AttributeError) as exc:
        return Status.FAIL, [f"rules file {path}: cannot be read: {exc}"[:300]]
    if theirs == groups:
        return Status.PASS, [f"rules file {path}: as a fresh export writes it"]
    count = sum(len(g.get("rules") or []) for g in theirs if isinstance(g, dict))
    return Status.FAIL, [f"rules file {path}: differs from a fresh export ({count} alerting rule(s) in it): "
                         "the rules or the baseline changed since it was written"]  # fmt: skip


def _dashboard(ctx: Context) -> tuple[Status, list[str]]:
    from specguard.preflight.dashboard import check_dashboard

    path = ctx.loaded.config.preflight.prometheus.grafana_dashboard
    if path is None:
        return Status.UNKNOWN, ["Grafana dashboard: preflight.prometheus.grafana_dashboard not set: which "
                                "file Grafana provisions is not known here"]  # fmt: skip
    try:
        found = check_dashboard(path, ctx.loaded)
    except (OSError, ValueError) as exc:
        return Status.FAIL, [f"Grafana dashboard {path}: cannot be read: {exc}"[:300]]
    if found.problems:
        return Status.FAIL, [f"Grafana dashboard {path}: not current with the catalog:", *found.problems]
    return Status.PASS, [f"Grafana dashboard {path}: {found.queries} queries, every metric as the catalog "
                         f"spells it; the rules' signals on it: {', '.join(found.signals) or 'none'}"]  # fmt: skip


def _prometheus(ctx: Context) -> tuple[str | None, str | None, bool]:
    """Prometheus's URL, the bearer token (only to the source's own URL) and whether TLS is verified."""
    config = ctx.loaded.config
    source = config.sources.prometheus
    url = config.preflight.prometheus.url or (source.url if source is not None else None)
    same = source is not None and url == source.url
    return url, ctx.loaded.prometheus_token if same else None, source.verify_tls if same and source else True


async def check(ctx: Context) -> Answer:
    from specguard.preflight.prometheus_api import Prometheus, PrometheusError

    config = str(ctx.config_file) if ctx.config_file is not None else "CONFIG"
    rules_out = ctx.loaded.config.preflight.prometheus.rules_file or "/etc/prometheus/rules/specguard.yml"
    export = (f"specguard export prometheus-rules --config {config} -o {rules_out} && "
              f"promtool check rules {rules_out} && systemctl reload prometheus")  # fmt: skip
    parts: list[tuple[Status, list[str], str | None]] = []
    groups, alerting = _exported(ctx)
    url, token, verify = _prometheus(ctx)
    if url is None:
        parts.append((Status.UNKNOWN, ["Prometheus: no URL (preflight.prometheus.url or sources.prometheus.url)"],
                      "set preflight.prometheus.url to the Prometheus that scrapes vLLM"))  # fmt: skip
    else:
        try:
            up, vllm_jobs, loaded = await Prometheus(url, token, verify).gather()
        except PrometheusError as exc:
            parts.append((Status.FAIL, [f"Prometheus {url}: {exc}"], "start Prometheus, or correct its URL"))
        else:
            status, lines = _targets(ctx, up, vllm_jobs)
            parts.append((status, [f"Prometheus {url}:", *lines],
                          "add the missing targets to prometheus.yml's scrape_configs (docs/install.md), "
                          "or start what is down"))  # fmt: skip
            status, lines = _rules(groups, loaded)
            parts.append((status, [f"exported rules: {len(groups)} group(s), {alerting} alerting rule(s)", *lines],
                          export))  # fmt: skip
    status, lines = _rules_file(ctx, groups)
    parts.append((status, lines, export))
    status, lines = _dashboard(ctx)
    parts.append((status, lines, "provision deploy/grafana/specguard.json of this release, or correct the "
                  "queries listed; set preflight.prometheus.grafana_dashboard to the file Grafana reads"))  # fmt: skip
    worst = max((s for s, _, _ in parts), key=RANK.__getitem__)
    fixes = [fix for s, _, fix in parts if s is not Status.PASS and fix]
    evidence = tuple(line for _, lines, _ in parts for line in lines)
    return Answer(worst, evidence, "; ".join(dict.fromkeys(fixes)) or None)
