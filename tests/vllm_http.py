"""What a client sees of vLLM's HTTP API: a fixed list of requests, and the shape of every answer.

The same probes run against a real vLLM 0.32.0 (the real-vLLM tier does it live; the capture in
``tests/fixtures/vllm-0.32.0-http.json`` was taken from it with this module) and against the
simulator, and the answers are compared as a client would meet them: status, the headers a client
reads, and the body's shape (keys in order, value types, how many choices). Bodies that are the same
on every run (errors, /version, /load) are compared exactly.

Generated text, ids and timestamps differ from run to run and are compared by shape only. In a
stream, speculative decoding puts a varying number of tokens in each chunk, so a stream is compared
as its first event, the set of distinct event shapes, its last two events and ``[DONE]``.

Regenerate the capture against a real vLLM serving the e2e tier's tiny model (served as
``tiny-llama``, ``--max-model-len 1024``, ``num_speculative_tokens`` 4)::

    .venv/bin/python -m tests.vllm_http http://127.0.0.1:8000 tests/fixtures/vllm-0.32.0-http.json
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import aiohttp

# Headers a client may act on; date and content-length change with every answer.
HEADERS = ("content-type", "allow", "server", "vary", "content-encoding")
# Prometheus 2.42's scrape Accept header (OpenMetrics first), which a negotiating server answers
# with `escaping=underscores` (reference: vllm.md, "Content type and negotiation").
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
_HELLO = [{"role": "user", "content": "hello"}]


@dataclass(frozen=True)
class Probe:
    name: str
    method: str
    path: str
    body: Any = None  # JSON-serialisable, or str sent as is
    headers: dict[str, str] = field(default_factory=dict)
    exact: bool = False  # the body is the same on every run: compare it whole


def _json(name: str, path: str, body: Any, exact: bool = False) -> Probe:
    return Probe(name, "POST", path, body, {"Content-Type": "application/json"}, exact)


def _error(name: str, path: str, body: Any) -> Probe:
    return _json(name, path, body, exact=True)


COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"

PROBES: tuple[Probe, ...] = (
    Probe("health", "GET", "/health", exact=True),
    Probe("health-post", "POST", "/health", exact=True),
    Probe("version", "GET", "/version", exact=True),
    Probe("models", "GET", "/v1/models"),
    Probe("load", "GET", "/load", exact=True),
    Probe("ping", "GET", "/ping", exact=True),
    Probe("ping-post", "POST", "/ping", exact=True),
    Probe("unknown-route", "GET", "/v2/nothing", exact=True),
    Probe("completions-get", "GET", COMPLETIONS, exact=True),
    Probe("metrics", "GET", "/metrics"),
    Probe("metrics-prometheus-accept", "GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}),
    _json("completion", COMPLETIONS, {"prompt": "hello there", "max_tokens": 3, "temperature": 0}),
    _json(
        "completion-default-max-tokens",
        COMPLETIONS,
        {"prompt": [5, 6, 7], "temperature": 0, "ignore_eos": True},
    ),
    _json(
        "completion-clamped-to-context",
        COMPLETIONS,
        {"prompt": [5] * 1000, "max_tokens": 600, "ignore_eos": True, "temperature": 0},
    ),
    _json("completion-n2", COMPLETIONS, {"prompt": "hello there", "max_tokens": 3, "n": 2, "temperature": 1}),
    _json("completion-batch", COMPLETIONS, {"prompt": ["a", "b"], "max_tokens": 1, "temperature": 0}),
    _json(
        "completion-logprobs",
        COMPLETIONS,
        {"prompt": "hello there", "max_tokens": 3, "logprobs": 2, "temperature": 0},
    ),
    _json(
        "completion-stream",
        COMPLETIONS,
        {"prompt": "hello there", "max_tokens": 2, "stream": True, "temperature": 0},
    ),
    _json(
        "completion-stream-n2-usage-logprobs",
        COMPLETIONS,
        {
            "prompt": "hello there",
            "max_tokens": 3,
            "n": 2,
            "temperature": 1,
            "logprobs": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    _json("chat", CHAT, {"messages": _HELLO, "max_tokens": 2, "temperature": 0}),
    _json("chat-n2", CHAT, {"messages": _HELLO, "max_tokens": 2, "n": 2, "temperature": 1}),
    _json(
        "chat-logprobs",
        CHAT,
        {"messages": _HELLO, "max_tokens": 2, "logprobs": True, "top_logprobs": 2, "temperature": 0},
    ),
    _json(
        "chat-stream",
        CHAT,
        {"messages": _HELLO, "max_tokens": 3, "stream": True, "temperature": 0},
    ),
    _json(
        "chat-stream-n2-usage-logprobs",
        CHAT,
        {
            "messages": _HELLO,
            "max_tokens": 2,
            "n": 2,
            "temperature": 1,
            "logprobs": True,
            "top_logprobs": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    # Errors, each answered the same way every time.
    _error("error-not-json", COMPLETIONS, "{not json"),
    _error("error-not-object", COMPLETIONS, "[1, 2]"),
    Probe(
        "error-not-json-content-type",
        "POST",
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": 1},
        {"Content-Type": "text/plain"},
        exact=True,
    ),
    _error("error-no-prompt", COMPLETIONS, {"max_tokens": 3}),
    _error("error-empty-prompt", COMPLETIONS, {"prompt": ""}),
    _error("error-unknown-model", COMPLETIONS, {"prompt": "hi", "model": "gpt-4"}),
    _error("error-negative-temperature", COMPLETIONS, {"prompt": "hi", "temperature": -1}),
    _error("error-max-tokens-zero", COMPLETIONS, {"prompt": "hi", "max_tokens": 0}),
    _error("error-max-tokens-over-context", COMPLETIONS, {"prompt": "hi", "max_tokens": 5000}),
    _error("error-prompt-fills-context", COMPLETIONS, {"prompt": [5] * 1024, "max_tokens": 1}),
    _error("error-prompt-over-context", COMPLETIONS, {"prompt": [5] * 1025, "max_tokens": 1}),
    _error(
        "error-stream-options-without-stream",
        COMPLETIONS,
        {"prompt": "hi", "stream_options": {"include_usage": True}},
    ),
    _error("error-n-zero", COMPLETIONS, {"prompt": "hi", "n": 0}),
    _error("error-n2-greedy", COMPLETIONS, {"prompt": "hi", "n": 2, "temperature": 0}),
    _error("error-logprobs-over-max", COMPLETIONS, {"prompt": "hi", "logprobs": 21}),
    _error("error-max-tokens-not-int", COMPLETIONS, {"prompt": "hi", "max_tokens": "a"}),
    _error("error-chat-no-messages", CHAT, {}),
    _error("error-chat-messages-not-list", CHAT, {"messages": "x"}),
    _error("error-chat-empty-messages", CHAT, {"messages": []}),
    _error("error-chat-top-logprobs-without-logprobs", CHAT, {"messages": _HELLO, "top_logprobs": 2}),
    _error(
        "error-chat-top-logprobs-over-max", CHAT, {"messages": _HELLO, "logprobs": True, "top_logprobs": 21}
    ),
)


async def observe(session: aiohttp.ClientSession, base_url: str, probe: Probe) -> dict[str, Any]:
    """What the server at ``base_url`` answers ``probe``: status, client-visible headers and body."""
    data: str | None
    if probe.body is None:
        data = None
    elif isinstance(probe.body, str):
        data = probe.body
    else:
        data = json.dumps(probe.body)
    async with session.request(
        probe.method, base_url + probe.path, data=data, headers=probe.headers, auto_decompress=False
    ) as response:
        raw = await response.read()
        headers = {name: response.headers[name] for name in HEADERS if name in response.headers}
        status = response.status
    content_type = headers.get("content-type", "")
    body: Any
    if probe.path == "/metrics":
        body = None  # compared family by family elsewhere (tests/sim/test_sim_metrics.py)
    elif content_type.startswith("text/event-stream"):
        body = _events(raw.decode())
    elif content_type.startswith("application/json"):
        body = json.loads(raw)
    else:
        body = raw.decode(errors="replace")
    return {"status": status, "headers": headers, "body": body}


async def observe_all(base_url: str, probes: tuple[Probe, ...] = PROBES) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        return {probe.name: await observe(session, base_url, probe) for probe in probes}


def _events(text: str) -> list[Any]:
    events: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# --- comparing -------------------------------------------------------------------------------------


def shape(value: Any, key: str = "") -> Any:
    """Keys in order and value types, recursively. ``choices`` keeps its length; other lists keep
    the distinct shapes of their items (how many tokens a list holds depends on the run), and a
    completion's ``top_logprobs`` maps tokens (which differ) to numbers."""
    if isinstance(value, dict):
        if key == "top_logprobs_entry":
            return "token -> logprob"
        return [[k, shape(v, k)] for k, v in value.items()]
    if isinstance(value, list):
        if key == "bytes":
            return "utf-8 bytes"  # of the token's text, which may be empty
        if key == "choices":
            return [shape(item) for item in value]
        inner = "top_logprobs_entry" if key == "top_logprobs" else ""
        distinct: list[Any] = []
        for item in value:
            item_shape = shape(item, inner)
            if item_shape not in distinct:
                distinct.append(item_shape)
        return ["list of", *distinct]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "str"


def one_choice_each(events: list[Any]) -> list[Any]:
    """The stream's events with a chunk of several choices split into one chunk per choice."""
    out: list[Any] = []
    for event in events:
        choices = event.get("choices") if isinstance(event, dict) else None
        if isinstance(choices, list) and len(choices) > 1:
            out += [{**event, "choices": [choice]} for choice in choices]
        else:
            out.append(event)
    return out


def view(probe: Probe, observed: dict[str, Any]) -> dict[str, Any]:
    """What the comparison looks at for one answer."""
    body = observed["body"]
    if probe.exact:
        shown: Any = body
    elif isinstance(body, list) and body and body[-1] == "[DONE]":
        # How many chunks there are, and the order the chunks of several choices interleave in,
        # are the run's own: compare the first and last events, and the set of shapes of those in
        # between (``middle``; see differences() for a stream that has none). So is whether one
        # chunk carries two choices' tokens or each its own (a server under load batches more):
        # a chunk is looked at one choice at a time.
        body = one_choice_each(body)
        middle = sorted({json.dumps(shape(event)) for event in body[1:-2]})
        shown = {"first": shape(body[0]), "middle": middle, "last": [shape(e) for e in body[-2:]]}
        shown["choice indexes"] = sorted(
            {c["index"] for e in body if isinstance(e, dict) for c in e.get("choices", [])}
        )
    else:
        shown = shape(body)
    return {"status": observed["status"], "headers": observed["headers"], "body": shown}


def differences(
    real: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]], probes: tuple[Probe, ...] = PROBES
) -> dict[str, tuple[Any, Any]]:
    """Probe name -> (what the real vLLM answered, what ``other`` answered), where they differ."""
    out: dict[str, tuple[Any, Any]] = {}
    for probe in probes:
        want, got = view(probe, real[probe.name]), view(probe, other[probe.name])
        streams = [v["body"] for v in (want, got) if isinstance(v["body"], dict) and "middle" in v["body"]]
        if len(streams) == 2 and not all(b["middle"] for b in streams):
            # A short stream may or may not have chunks between its first and last: with speculative
            # decoding one step can bring every token left (vLLM 0.32.0 answers a 3-token request
            # in two chunks or in three, run by run). Their shapes are compared when both have some.
            for b in streams:
                b["middle"] = []
        if want != got:
            out[probe.name] = (want, got)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    url, out = argv
    observed = asyncio.run(observe_all(url.rstrip("/")))
    for card in observed["models"]["body"]["data"]:
        card["root"] = card["id"]  # the served model's directory on the capturing machine
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(observed, handle, indent=1, ensure_ascii=False)
        handle.write("\n")
    print(f"{len(observed)} answers written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
