"""The OpenAI-compatible request and response bodies, shaped like vLLM 0.32's.

Requests are validated the way vLLM validates them, with vLLM's error messages (captured from a real
vLLM 0.32.0 in tests/fixtures/vllm-0.32.0-http.json): type errors as FastAPI's "N validation
error(s)" list, value errors as vLLM's ``message (parameter=..., value=...)``. Unknown fields are
allowed and ignored, as vLLM does. Responses copy the field sets and key order of the captured
answers, ``null`` fields included, because clients and benchmarks key on them.

Defaults as vLLM 0.32 applies them: ``/v1/completions`` generates 16 tokens unless ``max_tokens``
says otherwise, chat generates up to the end of the context window, and a ``max_tokens`` that does
not fit beside the prompt is cut to what fits (only one larger than the whole window is refused).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from specguard.sim.tokens import VOCAB_SIZE, TokenLogprob, chat_prompt_token_ids, text_token_ids

VLLM_VERSION = "0.32.0"
# vLLM's default temperature when neither the request nor the model's generation_config.json sets
# one (the simulated model has none): 1.0, as in OpenAI's API.
DEFAULT_TEMPERATURE = 1.0
COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
_GREEDY = 1e-5  # vLLM's _SAMPLING_EPS: below it, sampling is greedy

Kind = Literal["chat", "completion"]


def system_fingerprint(config: object) -> str:
    """``vllm-<version>-<8 hex>``, a digest of the serving configuration (vLLM's get_system_fingerprint)."""
    digest = hashlib.sha256(repr(config).encode()).hexdigest()[:8]
    return f"vllm-{VLLM_VERSION}-{digest}"


# --- errors ---------------------------------------------------------------------------------------


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


def _pydantic_errors(exc: ValidationError) -> list[dict[str, Any]]:
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


# --- requests -------------------------------------------------------------------------------------


class OpenBody(BaseModel):
    model_config = ConfigDict(extra="allow")  # the OpenAI API allows extra fields; vLLM ignores them


_Body = TypeVar("_Body", bound=BaseModel)


class StreamOptions(OpenBody):
    include_usage: bool | None = True  # vLLM's default once stream_options is given
    continuous_usage_stats: bool | None = False


class _GenerationRequest(OpenBody):
    model: str | None = None  # vLLM serves its (only) model when the request names none
    max_tokens: int | None = None
    temperature: float | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def effective_temperature(self) -> float:
        return DEFAULT_TEMPERATURE if self.temperature is None else self.temperature

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def prompts(self) -> list[tuple[int, ...]]:
        """The token ids of every prompt (completions may batch several)."""
        raise NotImplementedError

    def top_logprobs_count(self) -> int | None:
        """How many alternatives to show per token; None: no logprobs."""
        raise NotImplementedError

    def check(self) -> None:
        """vLLM's own checks of the request body, before the prompt is looked at."""
        if self.stream_options is not None and not self.stream:
            raise invalid("Stream options can only be defined when `stream=True`.", "stream_options")


class ContentPart(OpenBody):
    type: str
    text: str | None = None


class ChatMessage(OpenBody):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content if part.type == "text")
        return self.content or ""


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def check(self) -> None:
        super().check()
        top = self.top_logprobs
        if top is not None and top < 0 and top != -1:
            raise invalid("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
        if top is not None and (top == -1 or top > 0) and not self.logprobs:
            raise invalid("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        if not self.messages:
            raise RequestError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )

    def prompts(self) -> list[tuple[int, ...]]:
        return [tuple(chat_prompt_token_ids((m.role, m.text()) for m in self.messages))]

    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]] | None = None
    logprobs: int | None = None

    def check(self) -> None:
        super().check()
        if self.prompt is None or self.prompt == "" or self.prompt == []:
            raise invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")

    def prompts(self) -> list[tuple[int, ...]]:
        prompt = self.prompt
        assert prompt is not None
        if isinstance(prompt, str):
            return [tuple(text_token_ids(prompt))]
        if all(isinstance(item, int) for item in prompt):
            return [tuple(int(item) for item in prompt)]  # type: ignore[arg-type]
        return [
            tuple(text_token_ids(item)) if isinstance(item, str) else tuple(item)  # type: ignore[arg-type]
            for item in prompt
        ]

    def top_logprobs_count(self) -> int | None:
        return self.logprobs


def parse_request(
    kind: type[_GenerationRequest], content_type: str | None, body: bytes
) -> _GenerationRequest:
    """Parse and validate a request body as vLLM's FastAPI layer does. Raises RequestError (400)."""
    request = parse_body(kind, content_type, body)
    request.check()
    return request


def parse_body(kind: type[_Body], content_type: str | None, body: bytes) -> _Body:
    """A JSON body as ``kind``, with the errors of vLLM's FastAPI layer. Raises RequestError (400)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise validation_error(["Unsupported Media Type: Only 'application/json' is allowed"])
    try:
        data = json.loads(body)
    except UnicodeDecodeError:
        raise validation_error(
            [{"type": "json_invalid", "loc": ("body", 0), "msg": "JSON decode error", "input": {}}]
        ) from None
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid",
            "loc": ("body", exc.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": exc.msg},
        }
        raise validation_error([error]) from None
    try:
        return kind.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        raise validation_error(_pydantic_errors(exc)) from None


@dataclass(frozen=True)
class Plan:
    """What an accepted request asks of the engine: one generation per prompt and choice."""

    prompts: list[tuple[int, ...]]
    n: int
    max_tokens: int  # per choice, after vLLM's defaults and its cut to the context window
    temperature: float
    top_logprobs: int | None  # None: no logprobs


def plan(
    request: _GenerationRequest, kind: Kind, served_model: str, max_model_len: int, max_logprobs: int
) -> Plan:
    """Check a parsed request against the served model the way vLLM does. Raises RequestError."""
    if request.model is not None and request.model != served_model:
        raise RequestError(
            f"The model `{request.model}` does not exist. Valid aliases: {served_model}.", 404, "model"
        )
    prompts = request.prompts()
    longest = max(len(prompt) for prompt in prompts)
    if longest > max_model_len:
        text_prompt = isinstance(getattr(request, "prompt", None), str) or kind == "chat"
        # The tokenizer stops one token past the limit, so a text prompt reports "at least".
        count = max_model_len + 1 if text_prompt else longest
        qualifier = "at least " if count == max_model_len + 1 else ""
        raise invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains {qualifier}{count} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            count,
        )
    requested = request.requested_max_tokens()
    if requested is not None and requested > max_model_len:
        raise invalid(
            f"max_tokens={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            requested,
        )
    if requested is None and kind == "completion":
        requested = COMPLETION_DEFAULT_MAX_TOKENS
    room = max_model_len - longest
    max_tokens = room if requested is None else min(requested, room)

    temperature = request.effective_temperature
    if request.n < 1:
        raise RequestError(f"n must be at least 1, got {request.n}.")
    if temperature < 0:
        raise invalid(f"temperature must be non-negative, got {temperature}.", "temperature", temperature)
    if temperature > 2:
        raise invalid(f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature)
    if max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if temperature < _GREEDY and request.n > 1:
        raise RequestError(f"n must be 1 when using greedy sampling, got {request.n}.")
    top = request.top_logprobs_count()
    if top is not None:
        wanted = VOCAB_SIZE if top == -1 else top
        if wanted > max_logprobs:
            raise invalid(
                f"Requested sample logprobs of {wanted}, which is greater than max allowed: {max_logprobs}",
                "logprobs",
                wanted,
            )
    return Plan(prompts, request.n, max_tokens, temperature, top)


# --- responses ------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


@dataclass(frozen=True)
class Choice:
    """One finished choice of a non-streamed response."""

    index: int
    text: str
    finish_reason: str
    logprobs: Sequence[TokenLogprob] | None


class ResponseShape:
    """Bodies of one response of one endpoint (chat or completions)."""

    def __init__(self, kind: Kind, request_id: str, model: str, fingerprint: str) -> None:
        self.kind = kind
        self.id = request_id
        self.model = model
        self.fingerprint = fingerprint
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def role_chunk(self, index: int) -> dict[str, Any]:
        """A chat stream's first chunk of choice ``index`` (``delta.role``)."""
        choice = {
            "index": index,
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

    def chunk(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: Sequence[TokenLogprob] | None = None,
        text_offset: int = 0,
        final: bool = False,
        running_usage: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """One streamed step of choice ``index``. ``final``: the stream's end with no usage chunk after
        it, which carries the system fingerprint."""
        choice: dict[str, Any] = {"index": index}
        if self.kind == "chat":
            choice["delta"] = {"content": text}
            choice["logprobs"] = None if logprobs is None else chat_logprobs(logprobs)
            choice["finish_reason"] = finish_reason
            if finish_reason is not None:
                choice["stop_reason"] = None  # the stop string or token id; EOS and length give null
        else:
            choice["text"] = text
            choice["logprobs"] = None if logprobs is None else completion_logprobs(logprobs, text_offset)
            choice["finish_reason"] = finish_reason
            choice["stop_reason"] = None
            choice["prompt_token_ids"] = None
        choice["token_ids"] = None
        out = {**self._head(self._chunk_object), "choices": [choice]}
        if final and finish_reason is not None:
            out["system_fingerprint"] = self.fingerprint
        if running_usage is not None:
            out["usage"] = running_usage
        return out

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {
            **self._head(self._chunk_object),
            "choices": [],
            "usage": usage(prompt_tokens, completion_tokens),
            "system_fingerprint": self.fingerprint,
        }

    def complete(
        self, choices: Sequence[Choice], prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        """The whole non-streaming response."""
        out: list[dict[str, Any]] = []
        for choice in choices:
            item: dict[str, Any] = {"index": choice.index}
            if self.kind == "chat":
                item["message"] = {
                    "role": "assistant",
                    "content": choice.text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                }
                item["logprobs"] = None if choice.logprobs is None else chat_logprobs(choice.logprobs)
            else:
                item["text"] = choice.text
                item["logprobs"] = (
                    None if choice.logprobs is None else completion_logprobs(choice.logprobs, 0)
                )
            item.update(finish_reason=choice.finish_reason, stop_reason=None, token_ids=None)
            if self.kind == "completion":
                item.update(prompt_logprobs=None, prompt_token_ids=None)
            item["routed_experts"] = None
            out.append(item)
        body = {
            **self._head("chat.completion" if self.kind == "chat" else "text_completion"),
            "choices": out,
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": {
                **usage(prompt_tokens, completion_tokens),
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            },
        }
        if self.kind == "chat":
            body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return body


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {**entry(t.token, t.logprob), "top_logprobs": [entry(a, lp) for a, lp in t.top]} for t in tokens
        ]
    }


def completion_logprobs(tokens: Sequence[TokenLogprob], text_offset: int) -> dict[str, Any]:
    """``{"text_offset", "token_logprobs", "tokens", "top_logprobs": [{token: logprob}]}``."""
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [t.logprob for t in tokens],
        "tokens": [t.token for t in tokens],
        "top_logprobs": [dict(t.top) for t in tokens],
    }


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event, compact JSON as vLLM writes it."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def models_body(model: str, max_model_len: int, created: int) -> dict[str, Any]:
    """``GET /v1/models`` (vLLM's ModelList with one ModelCard)."""
    permission = {
        "id": f"modelperm-{hashlib.sha256(model.encode()).hexdigest()[:16]}",
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
