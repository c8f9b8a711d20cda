"""Alertmanager's webhook payload, version 4, read leniently: fields are added over releases
(``notification_reason`` in 0.32, ``routeLabels`` in 0.34), so unknown keys are ignored and only
what specguard uses is required."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Alertmanager sends a firing alert's endsAt as Go's zero time: "not set", never a moment.
_ZERO_YEAR = 1
MAX_REASONS = 3  # validation problems quoted in a 400 answer
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class AlertStatus(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Alert(_Lenient):
    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime = Field(alias="startsAt")
    ends_at: datetime | None = Field(None, alias="endsAt")
    generator_url: str = Field("", alias="generatorURL")
    fingerprint: str = Field(min_length=1, max_length=128)

    @field_validator("ends_at")
    @classmethod
    def _unset(cls, value: datetime | None) -> datetime | None:
        return None if value is not None and value.year == _ZERO_YEAR else value

    @field_validator("starts_at", "ends_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("a timestamp needs its time zone (RFC 3339)")
        if value is not None:
            try:
                value.astimezone(UTC)
            except OverflowError:
                raise ValueError("the timestamp is out of range in UTC") from None
        return value

    @property
    def starts(self) -> str:
        """startsAt in one spelling, for the deduplication key."""
        return self.starts_at.astimezone(UTC).isoformat()

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


class Message(_Lenient):
    version: str
    group_key: str = Field(alias="groupKey")
    truncated_alerts: int = Field(0, alias="truncatedAlerts", ge=0, lt=2**63)  # an SQLite integer
    status: AlertStatus
    receiver: str = ""
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    external_url: str = Field("", alias="externalURL")
    alerts: list[Alert]

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value != "4":
            raise ValueError(f"webhook payload version {value!r} is not supported (Alertmanager sends 4)")
        return value


class BadPayload(ValueError):
    """The body is not an Alertmanager webhook payload; the message says why (for a 400)."""


def parse(body: bytes) -> Message:
    """The message in ``body``. Raises BadPayload with a short reason."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadPayload(f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadPayload(f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BadPayload("the body is nested too deeply") from None
    except ValueError as exc:  # an integer too long to convert, say
        raise BadPayload(f"the body is not usable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadPayload("the body is not a JSON object")
    # JSON may escape lone surrogates ("\ud800"): text no store, log or HTTP header can hold. Only
    # a body with a surrogate escape at all is checked whole.
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadPayload("a string in the body is not valid Unicode (a lone surrogate escape)") from None
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        raise BadPayload(describe(exc)) from None
    except RecursionError:
        raise BadPayload("the body is nested too deeply") from None


def describe(exc: ValidationError) -> str:
    """``alerts.0.startsAt: Input should be a valid datetime; ...``, the first few problems."""
    problems = exc.errors(include_url=False, include_input=False)
    parts = []
    for item in problems[:MAX_REASONS]:
        where = ".".join(str(part) for part in item["loc"]) or "body"
        parts.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
    more = len(problems) - MAX_REASONS
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
