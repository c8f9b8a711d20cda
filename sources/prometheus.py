"""The Prometheus source: each signal is one PromQL instant query against a Prometheus server.

prometheus-api-client is synchronous (requests), so every call runs in a worker thread. Two of its
defaults do not suit a daemon and are overridden: no client timeout (a hung Prometheus would stall
the evaluation round forever) and three hidden retries with backoff on 5xx (one 503 would cost four
requests and about six seconds). The scheduler's next round is the retry.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import re
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.exceptions import NameResolutionError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util import Retry

from specguard.common.redact import REDACTED, scrub, shown
from specguard.rules.durations import format_duration
from specguard.rules.matchers import Matcher
from specguard.rules.signals import Kind, Signal
from specguard.sources.base import ChainCounts, SourceResult, chain_result

# The client folds a non-200 answer into its message as ``HTTP Status Code 400 (b'...')``; the body
# is recovered from it to show Prometheus's own errorType and error to the operator.
_STATUS_MESSAGE = re.compile(r"HTTP Status Code (\d+) \((b(['\"]).*\3)\)\Z", re.DOTALL)
_MAX_MESSAGE = 400

_QUERY_ERRORS = (
    PrometheusApiClientException,
    requests.RequestException,  # connection refused, timeouts, TLS, a body that is not JSON
    ValueError,
    KeyError,  # a 200 answer without data.result (not Prometheus, e.g. a login page)
    TypeError,
)


class PrometheusSource:
    """Signals and raw PromQL from Prometheus. A failed query is an answer, never an exception."""

    kind = "prometheus"
    # Its answers come over the network: a round asks for every rule's reading at once (daemon/round.py).
    reads_ahead = True

    def __init__(
        self,
        url: str,
        timeout: float,
        bearer_token: str | None = None,
        verify_tls: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock``: evaluate every query at the time it gives (Unix seconds) instead of
        Prometheus's own now, so that several queries see the very same samples."""
        if timeout <= 0:
            raise ValueError(f"prometheus timeout must be positive, got {timeout!r}")
        # A trailing slash would make every request path start with "//".
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.verify_tls = verify_tls
        self._token = bearer_token  # never logged, never shown
        self._shown_url = shown(self.url)
        # Prometheus gives up on the query when the client would: no work left running for nobody.
        self._params = {"timeout": format_duration(timeout)}
        self._clock = clock
        self._client = PrometheusConnect(
            url=self.url,
            headers={"Authorization": f"Bearer {self._token}"} if self._token else {},
            disable_ssl=not verify_tls,
            retry=Retry(total=0, status_forcelist=[], raise_on_status=False),
            timeout=timeout,  # type: ignore[arg-type]  # annotated int; requests takes float seconds
        )

    def __repr__(self) -> str:
        return (
            f"PrometheusSource(url={self._shown_url!r}, timeout={self.timeout!r}, "
            f"bearer_token={'set' if self._token else None!r}, verify_tls={self.verify_tls!r})"
        )

    async def refresh(self) -> None:
        """Nothing to do: Prometheus keeps the history."""

    async def query_signal(
        self,
        signal: Signal,
        window: float,
        group_by: Sequence[str],
        match: Sequence[Matcher] = (),
        keep_intrinsic: bool = True,
    ) -> SourceResult:
        if signal.kind is Kind.CHAIN:
            return await self._chain(signal, window, group_by, match, keep_intrinsic)
        answer = await self._query(signal.promql(window, group_by, match, keep_intrinsic))
        return answer if isinstance(answer, SourceResult) else SourceResult.checked(signal, answer)

    async def _chain(
        self,
        signal: Signal,
        window: float,
        group_by: Sequence[str],
        match: Sequence[Matcher],
        keep_intrinsic: bool,
    ) -> SourceResult:
        """The chain model's acceptance from its parts' rates (four queries at one evaluation
        time); counts over the window are the rates times the window, as ``increase`` is."""
        queries = signal.chain_promql(window, group_by, match, keep_intrinsic)
        at = self._clock() if self._clock is not None else time.time()  # the parts see one moment
        answers: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        labels: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
        for part, expr in queries.items():
            answer = await self._query(expr, at)
            if isinstance(answer, SourceResult):
                return answer
            answers[part] = {}
            for series_labels, value in answer:
                key = tuple(sorted(series_labels.items()))
                answers[part][key] = value
                labels.setdefault(key, series_labels)
        counts = [
            ChainCounts(
                labels[key],
                successes=successes,
                trials=answers["trials"].get(key, 0.0),
                draft_tokens=answers["draft_tokens"].get(key, 0.0),
                expected_tokens=answers["expected_tokens"].get(key, 0.0),
            )
            for key, successes in answers["successes"].items()
            if math.isfinite(successes)
        ]
        return chain_result(signal, counts, window)

    async def query_expr(self, expr: str, at: float | None = None) -> SourceResult:
        """``expr`` evaluated now (the clock's), or at ``at`` (Unix seconds) when given."""
        answer = await self._query(expr, at)
        return answer if isinstance(answer, SourceResult) else SourceResult.of(answer)

    async def _query(
        self, expr: str, at: float | None = None
    ) -> SourceResult | list[tuple[Mapping[str, str], float]]:
        """The answer's (labels, value) pairs, or a failed result; evaluated at ``at`` (Unix
        seconds; default the clock's, else Prometheus's own now)."""
        # The requests session is shared by concurrent queries; its connection pool is thread-safe.
        try:
            params = dict(self._params)
            if at is None and self._clock is not None:
                at = self._clock()
            if at is not None:
                params["time"] = repr(at)
            result = await asyncio.to_thread(self._client.custom_query, expr, params=params)
        except _QUERY_ERRORS as exc:
            return self._failed(self._describe(exc))
        parsed = _parse_result(result)
        return self._failed(parsed) if isinstance(parsed, str) else parsed

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)

    def _failed(self, problem: str) -> SourceResult:
        message = scrub(f"prometheus {self._shown_url}: {problem}", self.url)
        # A proxy may echo request headers into its error page. Redact before shortening, so a
        # truncated token cannot slip through either.
        if self._token:
            message = message.replace(self._token, REDACTED)
        return SourceResult.failed(_short(message))

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, PrometheusApiClientException):
            return _describe_status(str(exc))
        if isinstance(exc, requests.exceptions.JSONDecodeError):
            return "the answer is not JSON: is this the Prometheus API?"
        if isinstance(exc, KeyError | TypeError):
            return "the answer has no data.result: is this the Prometheus API?"
        causes = _causes(exc)
        if any(isinstance(c, ConnectionRefusedError) for c in causes):
            return "connection refused"
        if any(isinstance(c, ConnectionResetError) for c in causes):  # RemoteDisconnected too
            return "connection closed without an answer"
        if any(isinstance(c, NameResolutionError) for c in causes):
            return f"cannot resolve host {urlsplit(self.url).hostname!r}"
        tls = [c for c in causes if isinstance(c, ssl.SSLError)]
        if tls:
            return f"TLS error: {tls[0]}"
        # urllib3's NewConnectionError subclasses its TimeoutError: refusals are ruled out above.
        if any(_is_timeout(c) for c in causes):
            return f"no answer within {format_duration(self.timeout)} (timeout)"
        return f"request failed: {exc}"


def _parse_result(result: object) -> list[tuple[Mapping[str, str], float]] | str:
    """The (labels, value) pairs of ``data.result``, or what is wrong with it.

    The client returns only ``data.result`` and drops ``resultType``: a vector is a list of
    ``{"metric": {...}, "value": [ts, "1.5"]}``, a scalar is ``[ts, "1.5"]``, a matrix carries
    ``"values"``. Values are strings; "NaN" and "+Inf" parse and are then dropped as no data.
    """
    if not isinstance(result, list):
        return f"unexpected answer: result is {type(result).__name__}"
    if len(result) == 2 and isinstance(result[0], int | float):
        value = _float(result[1])
        if value is None:
            return "the expression returns a string, not a number"
        return [({}, value)]
    items: list[tuple[Mapping[str, str], float]] = []
    for item in result:
        if isinstance(item, dict) and "values" in item:
            return "the expression returns a range vector; use an instant vector (e.g. rate(x[5m]))"
        sample = item.get("value") if isinstance(item, dict) else None
        labels = item.get("metric", {}) if isinstance(item, dict) else None
        value = _float(sample[1]) if isinstance(sample, list) and len(sample) == 2 else None
        if value is None or not isinstance(labels, dict):
            return f"unexpected answer: {item!r}"
        items.append(({str(k): str(v) for k, v in labels.items()}, value))
    return items


def _float(value: object) -> float | None:
    try:
        return float(value) if isinstance(value, str | int | float) else None
    except ValueError:
        return None


def _describe_status(message: str) -> str:
    """``bad_data: parse error ...`` from the client's ``HTTP Status Code 400 (b'{...}')``."""
    match = _STATUS_MESSAGE.match(message)
    if match is None:
        return message
    status = match.group(1)
    try:
        body = ast.literal_eval(match.group(2)).decode("utf-8", "replace")
    except (ValueError, SyntaxError):
        return f"HTTP {status}"
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("error"):
        return f"{answer.get('errorType', 'error')}: {answer['error']}"
    return f"HTTP {status}: {body}" if body.strip() else f"HTTP {status}"


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, NewConnectionError):
        return False
    return isinstance(exc, requests.Timeout | Urllib3Timeout | TimeoutError)


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and what it wraps: requests puts urllib3's MaxRetryError in args, its cause
    in ``reason``, and the socket error sits in ``__context__``."""
    seen: list[BaseException] = []
    todo: list[object] = [exc]
    while todo:
        current = todo.pop()
        if not isinstance(current, BaseException) or any(current is s for s in seen):
            continue
        seen.append(current)
        todo.extend([*current.args, getattr(current, "reason", None)])
        todo.extend([current.__cause__, current.__context__])
    return seen


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 3] + "..."
