"""Errors as vLLM 0.32 answers them: its error body, its value errors and FastAPI's validation errors.

Messages are vLLM's own (captured from a real vLLM 0.32.0 in tests/fixtures/vllm-0.32.0-http.json):
type errors as FastAPI's "N validation error(s)" list, value errors as vLLM's
``message (parameter=..., value=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError


class RequestError(Exception):
    """A request vLLM would refuse: the HTTP status and vLLM's error body."""

    def __init__(
        self, message: str, status: int = 400, param: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, status, param, kind)


def error_body(
    message: str, status: int, param: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}``."""
    default = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind or default, "param": param, "code": status}}


_NO_VALUE = object()


def invalid(message: str, param: str | None = None, value: object = _NO_VALUE) -> RequestError:
    """vLLM's VLLMValidationError: the parameter (and value) it names are appended to the message."""
    if param is not None:
        detail = f"parameter={param}" if value is _NO_VALUE else f"parameter={param}, value={value}"
        message = f"{message} ({detail})"
    return RequestError(message, param=param)


def _summary(value: object) -> object:
    """How vLLM's validation handler shows an offending input: containers by their size."""
    if isinstance(value, list | tuple | dict | set):
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:200] + "...[truncated]"
    return str(value)


def validation_error(errors: Sequence[dict[str, Any] | str]) -> RequestError:
    """FastAPI's request-validation error as vLLM 0.32 renders it (type "Bad Request")."""
    lines = []
    param: str | None = None
    for error in errors[:10]:
        if isinstance(error, dict):
            error = dict(error)
            if "input" in error:
                error["input"] = _summary(error["input"])
            error["loc"] = ".".join(str(part) for part in error["loc"])
            param = param or error["loc"]
        lines.append(f"  {error}")
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "\n".join(lines)
    return RequestError(message, param=param, kind="Bad Request")


def pydantic_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """A pydantic ValidationError as the error list of FastAPI's request validation."""
    out = []
    for item in exc.errors(include_url=False):
        error: dict[str, Any] = {
            "type": item["type"],
            "loc": ("body", *item["loc"]),
            "msg": item["msg"],
            "input": item["input"],
        }
        if "ctx" in item:
            error["ctx"] = item["ctx"]
        out.append(error)
    return out
