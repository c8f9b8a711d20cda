"""specguard.yaml: the daemon's configuration, and the baseline file it may name."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from specguard.common.addresses import is_loopback
from specguard.common.schedule import cron
from specguard.common.secrets import SecretRef
from specguard.common.sizes import parse_size
from specguard.config.preflight import PreflightConfig
from specguard.config.routing import RoutingConfig
from specguard.coordination.config import CoordinationConfig
from specguard.rules.durations import Duration, Interval
from specguard.sources.scrape import DEFAULT_MAX_PAGE_BYTES
from specguard.sources.targets import duplicate_instances, instance_label

DEFAULT_SCRAPE_TARGET = "http://127.0.0.1:8000/metrics"
DEFAULT_RULES = ("builtin:speculative",)
DEFAULT_PORT = 9464


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScrapeTarget(_Strict):
    """A target with a name: its series report ``instance=<name>`` instead of its host:port."""

    url: str
    name: str = Field(min_length=1)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value)


ByteSize = Annotated[int, BeforeValidator(parse_size)]


class ScrapeSourceConfig(_Strict):
    """Read vLLM's /metrics directly (one host, no Prometheus needed)."""

    targets: tuple[str | ScrapeTarget, ...] = Field((DEFAULT_SCRAPE_TARGET,), min_length=1)
    timeout: Duration = 5.0  # a whole scrape: connecting, reading and parsing the page
    max_page_size: ByteSize = DEFAULT_MAX_PAGE_BYTES  # a real vLLM page is about 60 KB per model

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: tuple[str | ScrapeTarget, ...]) -> tuple[str | ScrapeTarget, ...]:
        out = tuple(target if isinstance(target, ScrapeTarget) else _http_url(target) for target in value)
        urls = [target.url if isinstance(target, ScrapeTarget) else target for target in out]
        if len(set(urls)) != len(urls):
            raise ValueError("a target is listed twice")
        clash = duplicate_instances(
            {t.url: t.name for t in out if isinstance(t, ScrapeTarget)}
            | {t: instance_label(t) for t in out if isinstance(t, str)}
        )
        if clash:
            raise ValueError(clash)
        return out

    @property
    def urls(self) -> list[str]:
        return [target.url if isinstance(target, ScrapeTarget) else target for target in self.targets]

    @property
    def names(self) -> dict[str, str]:
        return {target.url: target.name for target in self.targets if isinstance(target, ScrapeTarget)}


class PrometheusSourceConfig(_Strict):
    """Ask a Prometheus server that scrapes vLLM."""

    url: str
    timeout: Duration = 10.0
    # Sent as "Authorization: Bearer ...": {credential: NAME}, {file: PATH} or {env: VARIABLE}.
    bearer_token: SecretRef | None = None
    bearer_token_file: Path | None = None  # the same as bearer_token: {file: PATH}
    verify_tls: bool = True

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _http_url(value)

    @model_validator(mode="after")
    def _one_token(self) -> PrometheusSourceConfig:
        if self.bearer_token is not None and self.bearer_token_file is not None:
            raise ValueError("give `bearer_token` or `bearer_token_file`, not both")
        return self

    @property
    def token_field(self) -> str:
        return "bearer_token_file" if self.bearer_token_file is not None else "bearer_token"

    def token_ref(self) -> SecretRef | None:
        if self.bearer_token_file is not None:
            return SecretRef(file=self.bearer_token_file)
        return self.bearer_token


class SourcesConfig(_Strict):
    scrape: ScrapeSourceConfig | None = None
    prometheus: PrometheusSourceConfig | None = None

    @model_validator(mode="after")
    def _one(self) -> SourcesConfig:
        if self.scrape is not None and self.prometheus is not None:
            raise ValueError("configure either `scrape` or `prometheus`, not both")
        return self

    @property
    def kind(self) -> str:
        return "prometheus" if self.prometheus is not None else "scrape"


DEFAULT_WEBHOOK_PATH = "/alertmanager"
DEFAULT_WEBHOOK_MAX_BODY = 2**20
DEFAULT_MAX_SILENCE = 30 * 86400.0
MIN_MAX_SILENCE, MAX_MAX_SILENCE = 60.0, 365 * 86400.0
CREDENTIAL_NAME = "webhook-token"  # the systemd credential the webhook token may come from
_RESERVED_PATHS = ("/healthz", "/metrics", "/api/", "/silences/")


class ServerConfig(_Strict):
    """The HTTP server: /healthz, /metrics, /api/status, and the Alertmanager webhook receiver."""

    listen: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    webhook_path: str = DEFAULT_WEBHOOK_PATH
    # The bearer token Alertmanager must send (its http_config.authorization.credentials_file):
    # {credential: NAME}, {file: PATH} or {env: VARIABLE}. None: the systemd credential
    # webhook-token when there is one, else no token, which is allowed on a loopback address only.
    webhook_token: SecretRef | None = None
    webhook_token_file: Path | None = None  # the same as webhook_token: {file: PATH}
    webhook_max_body_size: ByteSize = DEFAULT_WEBHOOK_MAX_BODY
    # The longest silence /api/silences adds: a longer one is refused (400) rather than forgotten.
    max_silence: Duration = DEFAULT_MAX_SILENCE

    @field_validator("max_silence")
    @classmethod
    def _max_silence(cls, value: float) -> float:
        if not MIN_MAX_SILENCE <= value <= MAX_MAX_SILENCE:
            raise ValueError("the longest silence is from 1m to 365d (default 30d)")
        return value

    @model_validator(mode="after")
    def _one_token(self) -> ServerConfig:
        if self.webhook_token is not None and self.webhook_token_file is not None:
            raise ValueError("give `webhook_token` or `webhook_token_file`, not both")
        return self

    @field_validator("webhook_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", value) or "//" in value:
            raise ValueError(f"{value!r} is not a URL path like /alertmanager")
        if value == "/" or any(value == p.rstrip("/") or value.startswith(p) for p in _RESERVED_PATHS):
            raise ValueError(f"{value!r} is taken by the daemon's own endpoints")
        return value

    @property
    def loopback(self) -> bool:
        """Whether only this host can reach the server."""
        return is_loopback(self.listen)

    @property
    def token_field(self) -> str:
        return "webhook_token_file" if self.webhook_token_file is not None else "webhook_token"

    def token_ref(self) -> SecretRef | None:
        """Where the webhook's token is: as configured, else the systemd credential webhook-token
        when systemd provides one."""
        if self.webhook_token_file is not None:
            return SecretRef(file=self.webhook_token_file)
        if self.webhook_token is not None:
            return self.webhook_token
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if credentials and (Path(credentials) / CREDENTIAL_NAME).is_file():
            return SecretRef(credential=CREDENTIAL_NAME)
        return None


DAY = 86400.0


class HistoryConfig(_Strict):
    """Per-minute rollups of every catalog signal, per server and model, for the weekly report."""

    enabled: bool = True
    retention: Duration = Field(35 * DAY, ge=DAY)
    max_size: ByteSize = 256 * 2**20  # the oldest minutes go first when history outgrows it
    # With the Prometheus source: the vLLM servers whose history the daemon keeps (it scrapes them
    # itself). With the scrape source, its own targets are recorded and this stays unset.
    scrape: ScrapeSourceConfig | None = None


class ReportConfig(_Strict):
    """The weekly report the daemon makes on its own (``specguard report`` makes one any time)."""

    timezone: str = "UTC"  # of the schedule
    schedule: str | None = "0 8 * * mon"  # crontab (minute hour day month weekday); null: none
    # A scheduled report runs from the schedule's previous time to its own, so consecutive reports
    # tile time whatever the clocks do. This is the least it covers, counted on the clock of
    # `timezone` (7d before Monday 08:00 is the Monday before at 08:00, 167 or 169 hours in a week
    # the clocks change): with runs closer together than this, each report covers this much before
    # its time and they overlap; with runs as far apart or further it changes nothing (but for a
    # schedule that never ran in the nine years before: then a report covers this much).
    period: Duration = Field(7 * DAY, ge=3600.0)
    formats: tuple[Literal["html", "md", "json"], ...] = ("html", "json")
    out_dir: Path | None = None  # default: <state_dir>/reports
    slack: str | None = None  # a `slack` action (with a bot token) to post the summary and charts

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        cron("0 0 * * *", value)  # raises ValueError naming the zone
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            cron(value, info.data.get("timezone", "UTC"))  # raises ValueError with the reason
        return value

    @field_validator("formats")
    @classmethod
    def _formats(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("give at least one of html, md, json")
        return value


# Keys that moved, and where to: a config that still has them gets this as its error.
MOVED_KEYS = {"listen": "server.listen", "port": "server.port"}


class Config(_Strict):
    server: ServerConfig = ServerConfig()
    sources: SourcesConfig = SourcesConfig()
    rules: tuple[str, ...] = DEFAULT_RULES  # files or globs; builtin:<pack> for shipped packs
    actions: dict[str, dict[str, Any]] = Field(default_factory=dict)
    baseline: Path | None = None
    state_dir: Path | None = None
    history: HistoryConfig = HistoryConfig()
    report: ReportConfig = ReportConfig()
    routing: RoutingConfig | None = None  # the nginx router's traffic classes (`specguard routing render`)
    # The serving file (`specguard serve-config`'s): the target, the draft and k that diagnose,
    # preflight and tune hold the running server to.
    serving: Path | None = None
    preflight: PreflightConfig = PreflightConfig()
    # The fleet's store (etcd or Redis) and the bounds on disruption it keeps; none: this host acts alone.
    coordination: CoordinationConfig | None = None
    interval: Interval = 15.0
    dry_run: bool = False
    log_format: Literal["auto", "json", "text"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def listen(self) -> str:
        return self.server.listen

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def scrape(self) -> ScrapeSourceConfig:
        return self.sources.scrape or ScrapeSourceConfig()

    def reports_dir(self) -> Path:
        return self.report.out_dir or self.resolved_state_dir() / "reports"

    def store_file(self) -> Path:
        """The store's database: ``specguard.db`` in the state directory."""
        return self.resolved_state_dir() / "specguard.db"

    def resolved_state_dir(self) -> Path:
        """``state_dir``, else ``$STATE_DIRECTORY`` (systemd), else the user's state directory."""
        if self.state_dir is not None:
            return self.state_dir
        from_systemd = os.environ.get("STATE_DIRECTORY")
        if from_systemd:
            return Path(from_systemd.split(":")[0])
        return Path(platformdirs.user_state_dir("specguard"))
