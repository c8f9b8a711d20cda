"""``POST /tokenize``: vLLM's token count of a prompt, with the served context length.

vLLM's OpenAI server takes a completion prompt (``{"prompt": "..."}``) or a chat
(``{"messages": [...]}``, the chat template applied) and answers ``{"count", "max_model_len",
"tokens", "token_strs"}`` (``vllm/entrypoints/serve/tokenize/protocol.py``), whatever the prompt's
length: counting is how a client learns that a prompt will not fit before it sends it. The
simulator counts with its own tokens (sim.tokens), the ones its generation requests are charged.
The shape follows vLLM's protocol; unlike the generation endpoints, it was not captured from a
running vLLM.
"""

from __future__ import annotations

from typing import Any

from specguard.sim.openai.errors import RequestError, invalid
from specguard.sim.openai.requests import ChatMessage, OpenBody, parse_body
from specguard.sim.tokens import chat_prompt_token_ids, text_token_ids


class TokenizeRequest(OpenBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True

    def token_ids(self) -> list[int]:
        if self.messages is not None:
            return chat_prompt_token_ids((m.role, m.text()) for m in self.messages)
        if self.prompt is None:
            raise invalid("Either prompt or messages must be provided.", "prompt")
        return text_token_ids(self.prompt)


def tokenize(content_type: str | None, body: bytes, served_model: str, max_model_len: int) -> dict[str, Any]:
    """The answer to ``POST /tokenize``. Raises RequestError (vLLM's status and body)."""
    request = parse_body(TokenizeRequest, content_type, body)
    if request.model is not None and request.model != served_model:
        raise RequestError(
            f"The model `{request.model}` does not exist. Valid aliases: {served_model}.", 404, "model"
        )
    tokens = request.token_ids()
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": None}
