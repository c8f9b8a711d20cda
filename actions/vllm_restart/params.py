"""The ``vllm_restart`` action's settings: the ladder of k values, the file that holds vLLM's
speculative config (an environment file or vLLM's YAML), how to restart vLLM and watch it, and
how long each step may take; each checked as the config is loaded."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from specguard.actions.acceptance import SprtParams
from specguard.actions.base import ActionParams, Budget
from specguard.actions.sizes import ResponseSize
from specguard.common.http import MAX_RESPONSE_SIZE
from specguard.common.paths import ConfigPath
from specguard.common.secrets import SecretRef
from specguard.rules.durations import Duration, format_duration


class EnvFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: ConfigPath  # e.g. /var/lib/specguard/vllm/speculative.env, the unit's EnvironmentFile


class VllmConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: ConfigPath  # the file vLLM is started with: --config PATH (.yaml or .yml)

    @field_validator("path")
    @classmethod
    def _yaml(cls, value: Any) -> Any:
        if not str(value).endswith((".yaml", ".yml")):
            raise ValueError("vLLM reads a --config file only when its name ends in .yaml or .yml")
        return value


class VllmRestartParams(ActionParams):
    type: Literal["vllm_restart"] = "vllm_restart"
    timeout: Duration = Field(1800.0, gt=0)  # a whole step: restart, verification, rollback
    cooldown: Duration = Field(600.0, ge=0)
    budget: Budget | None = Budget(runs=2, per=3600.0)
    ladder: tuple[int, ...]
    url: str = "http://127.0.0.1:8000"  # the vLLM server: /health, /version, /metrics
    # /health's and /version's bodies up to this size (over it, that check fails with the reason)
    max_response_size: ResponseSize = MAX_RESPONSE_SIZE
    env_file: EnvFile | None = None
    vllm_config: VllmConfigFile | None = None
    unit: str | None = None  # systemctl --no-ask-password restart UNIT
    command: tuple[str, ...] | None = None  # ... or this argument list, run without a shell
    command_timeout: Duration = Field(120.0, gt=0)
    # With `command`: exits 0 while the server's process runs, non-zero once it has stopped.
    status_command: tuple[str, ...] | None = None
    health_timeout: Duration = Field(600.0, gt=0)  # model loading included
    verify_requests: int = Field(4, ge=1, le=64)
    verify_max_tokens: int = Field(16, ge=2, le=1024)
    # After a restart with k > 0: has acceptance recovered? A sequential test, verify_requests per
    # round at verify_temperature (your traffic's, or it sees the draft at its best).
    verify_acceptance: SprtParams | None = None
    verify_temperature: float = Field(0.0, ge=0, le=2)
    model: str | None = None  # for the verification's requests; default: the first of /v1/models
    token: SecretRef | None = None  # vLLM's --api-key
    step_up_after: Duration | None = Field(None, gt=0)  # resolved this long: one rung up
    drain: str | None = None  # a feature_flag action: held during a step, so no user meets a restart

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(value) < 2:
            raise ValueError("give at least two rungs, e.g. [5, 3, 1, 0]")
        if any(k < 0 for k in value) or list(value) != sorted(set(value), reverse=True):
            raise ValueError(
                "rungs are numbers of speculative tokens >= 0, from the most down, e.g. [5, 3, 1, 0]"
            )
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("give the vLLM server's http:// or https:// base URL")
        return value.rstrip("/")

    @field_validator("command", "status_command", mode="before")
    @classmethod
    def _command(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            raise ValueError("give the command as a list of arguments; it is run without a shell")
        if value is not None and not value:
            instead = "use `unit`" if info.field_name == "command" else "leave it out"
            raise ValueError(f"an empty command: give its arguments, or {instead}")
        return value

    @model_validator(mode="after")
    def _one_each(self) -> VllmRestartParams:
        if (self.env_file is None) == (self.vllm_config is None):
            raise ValueError("say where vLLM reads its speculative config: `env_file` or `vllm_config`, one")
        if (self.unit is None) == (self.command is None):
            raise ValueError("say how vLLM is restarted: `unit` (systemctl) or `command`, one")
        if self.status_command is not None and self.unit is not None:
            raise ValueError("status_command goes with `command`; with `unit`, systemd says how the unit is")
        # A step that fails is rolled back within the same timeout: two restarts and two waits.
        longest = 2 * (self.command_timeout + self.health_timeout)
        if self.timeout < longest:
            raise ValueError(
                f"timeout {format_duration(self.timeout)} cannot hold a step and its rollback, which may take "
                f"{format_duration(longest)}: twice command_timeout {format_duration(self.command_timeout)} plus "
                f"health_timeout {format_duration(self.health_timeout)}; give timeout {format_duration(longest)} "
                "or more, or shorten those"
            )
        return self
