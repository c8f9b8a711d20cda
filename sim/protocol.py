"""The OpenAI-compatible request and response bodies, shaped like vLLM 0.32's.

Requests are validated with pydantic (unknown fields allowed and ignored, as vLLM does); a bad one
becomes a 400 with vLLM's error body. Responses copy the field sets of a captured vLLM 0.32.0
stream (tests/fixtures/vllm-0.32.0-chat-stream.sse), ``null`` fields included, because clients and
benchmarks key on them.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.tokens import chat_prompt_tokens, text_tokens

VLLM_VERSION = "0.32.0"
SYSTEM_FINGERPRINT = f"vllm-{VLLM_VERSION}-simulated"
# vLLM's default temperature when neither the request nor the model's generation_config.json sets
# one (the simulated model has none): 1.0, as in OpenAI's API.
DEFAULT_TEMPERATURE = 1.0


class RequestError(Exception):
    """A request vLLM would refuse: the HTTP status and vLLM's error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, status, param)


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # the OpenAI API allows extra fields; vLLM ignores them


class StreamOptions(_Open):
    include_usage: bool | None = True  # vLLM's default once stream_options is given
    continuous_usage_stats: bool | None = False


class _GenerationRequest(_Open):
    model: str | None = None  # vLLM serves its (only) model when the request names none
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False

    @model_validator(mode="after")
    def _check(self) -> _GenerationRequest:
        if self.n != 1:
            raise ValueError("the simulator generates one choice per request: n must be 1")
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def effective_temperature(self) -> float:
        return DEFAULT_TEMPERATURE if self.temperature is None else self.temperature

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def prompt_tokens(self) -> int:
        raise NotImplementedError


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content if part.type == "text")
        return self.content or ""


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt_tokens(self) -> int:
        return chat_prompt_tokens(message.text() for message in self.messages)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str]

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        batch = isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str)
        if batch and len(self.prompt) != 1:
            raise ValueError("the simulator serves one prompt per request")
        if not self.prompt or self.prompt == [""]:
            raise ValueError("The prompt cannot be empty.")
        return self

    def prompt_tokens(self) -> int:
        if isinstance(self.prompt, str):
            return text_tokens(self.prompt)
        if self.prompt and isinstance(self.prompt[0], str):
            return text_tokens(str(self.prompt[0]))
        return len(self.prompt)  # token ids


def parse_request(kind: type[_GenerationRequest], body: bytes) -> _GenerationRequest:
    """Parse and validate a request body. Raises RequestError (400)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError("The request body must be a JSON object.")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise RequestError(_describe(exc)) from None


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


# --- responses ----------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class ResponseShape:
    """Bodies of one response of one endpoint (chat or completions)."""

    def __init__(self, kind: Literal["chat", "completion"], request_id: str, model: str) -> None:
        self.kind = kind
        self.id = request_id
        self.model = model
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def role_chunk(self) -> dict[str, Any] | None:
        """The chat stream's first chunk (``delta.role``); completions have none."""
        if self.kind != "chat":
            return None
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return {
            **self._head(self._chunk_object),
            "choices": [choice],
            "prompt_token_ids": None,
            "prompt_text": None,
        }

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat":
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        if finish_reason is not None or self.kind == "completion":
            choice["stop_reason"] = None  # vLLM: the stop string or token id; EOS and length give null
        choice["token_ids"] = None
        return {**self._head(self._chunk_object), "choices": [choice]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {
            **self._head(self._chunk_object),
            "choices": [],
            "usage": usage(prompt_tokens, completion_tokens),
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def complete(
        self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        """The whole non-streaming response."""
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat":
            choice["message"] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning": None,
            }
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None, token_ids=None)
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {
            **self._head(obj),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {**usage(prompt_tokens, completion_tokens), "prompt_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event, compact JSON as vLLM writes it."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def models_body(model: str, max_model_len: int, created: int) -> dict[str, Any]:
    """``GET /v1/models`` (vLLM's ModelList with one ModelCard)."""
    permission = {
        "id": f"modelperm-{model}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
