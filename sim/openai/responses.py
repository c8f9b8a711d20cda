"""The OpenAI-compatible response bodies, shaped like vLLM 0.32's: whole answers, stream chunks,
log-probabilities, ``/v1/models`` and the system fingerprint.

Responses copy the field sets and key order of the answers captured from a real vLLM 0.32.0
(tests/fixtures/vllm-0.32.0-http.json), ``null`` fields included, because clients and benchmarks
key on them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specguard.sim.openai.requests import Kind
from specguard.sim.tokens import TokenLogprob

VLLM_VERSION = "0.32.0"


def system_fingerprint(config: object) -> str:
    """``vllm-<version>-<8 hex>``, a digest of the serving configuration (vLLM's get_system_fingerprint)."""
    digest = hashlib.sha256(repr(config).encode()).hexdigest()[:8]
    return f"vllm-{VLLM_VERSION}-{digest}"


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
