"""The OpenAI-compatible request bodies, parsed and checked the way vLLM 0.32 does.

Requests are validated the way vLLM validates them, with vLLM's error messages (sim.openai.errors).
Unknown fields are allowed and ignored, as vLLM does.

Defaults as vLLM 0.32 applies them: ``/v1/completions`` generates 16 tokens unless ``max_tokens``
says otherwise, chat generates up to the end of the context window, and a ``max_tokens`` that does
not fit beside the prompt is cut to what fits (only one larger than the whole window is refused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from specguard.sim.openai.errors import RequestError, invalid, pydantic_errors, validation_error
from specguard.sim.tokens import VOCAB_SIZE, chat_prompt_token_ids, text_token_ids

# vLLM's default temperature when neither the request nor the model's generation_config.json sets
# one (the simulated model has none): 1.0, as in OpenAI's API.
DEFAULT_TEMPERATURE = 1.0
COMPLETION_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
_GREEDY = 1e-5  # vLLM's _SAMPLING_EPS: below it, sampling is greedy

Kind = Literal["chat", "completion"]


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
        raise validation_error(pydantic_errors(exc)) from None


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
