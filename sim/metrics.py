"""``/metrics`` as vLLM 0.32 exposes it: the same families, types, labels, HELP texts and buckets.

The reference is the capture of a real vLLM 0.32.0 in tests/fixtures; a test holds the two
together. Families are registered in the capture's order into a private registry (plus the gc,
platform and process collectors, as vLLM's default registry has them), so several simulators can
run in one process.

Modelled: speculative-decoding counters (vLLM's counting rules, reference vllm.md section 1), token
counters, request outcomes, latency histograms, running/waiting/KV gauges, preemptions, the prefix
cache (queries, hits, prompt tokens by source) and the HTTP metrics of
prometheus-fastapi-instrumentator. Everything else (multi-modal and external caches, FLOPs
estimates, admission rejections...) exists with vLLM's idle value. With several data-parallel
engines every per-engine series exists once per `engine` label value, as vLLM's
PrometheusStatLogger creates them; the HTTP metrics and admission rejections are the API server's.

The page is served the way vLLM 0.32 serves it (``vllm/entrypoints/serve/instrumentator/
metrics.py``): ``GET /metrics`` is prometheus-fastapi-instrumentator's handler, which always
answers the Prometheus text format (``text/plain; version=1.0.0``) with names as registered, colons
included, whatever the ``Accept`` header asks. Anything else under ``/metrics`` (another method, a
trailing slash) reaches prometheus_client's ASGI app, which negotiates the format and gzip, and
answers Prometheus's OpenMetrics-first header with ``escaping=underscores`` (and then, through
prometheus_client bug #1177, with underscores in the sample names): see :func:`render`.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
)
from prometheus_client.exposition import choose_encoder, generate_latest, gzip_accepted

from specguard.sim.engine.engine import Engine
from specguard.sim.engine.events import EngineStep
from specguard.sim.engine.records import RequestRecord
from specguard.sim.options import SimOptions

LABELS = ("model_name", "engine")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

# vllm/v1/metrics/buckets.py (reference vllm.md section 3)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
N_BUCKETS = (1, 2, 5, 10, 20)
# prometheus-fastapi-instrumentator's defaults
HTTP_HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0)  # fmt: skip
HTTP_BUCKETS = (0.1, 0.5, 1.0)
# vLLM's instrumentator leaves these handlers out (vllm/entrypoints/openai/api_server.py).
HTTP_EXCLUDED = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})


def one_two_five(limit: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50... up to ``limit``."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(value)
        exponent += 1


class VllmMetrics:
    """vLLM's engine metrics; listens to the simulated engine (sim.engine.events.EngineListener)."""

    def __init__(self, options: SimOptions) -> None:
        self.registry = CollectorRegistry()
        for collector in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
            self.registry.register(collector)
        # (model_name, engine) of every engine, as vLLM's per_engine_labelvalues
        self._engines = [(options.model, str(i)) for i in range(options.data_parallel_size)]
        self.k = options.num_speculative_tokens
        self._prefix_caching = options.enable_prefix_caching
        r = self.registry
        model = options.model
        each = self._engines

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*LABELS, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            metric = Histogram(name, doc, LABELS, buckets=buckets, registry=r)
            for labels in each:
                metric.labels(*labels)  # vLLM creates every series at startup
            return metric

        def idle_counter(name: str, doc: str) -> None:
            created = counter(name, doc)
            for labels in each:
                created.labels(*labels)

        if self.k:  # vLLM has no spec_decode series at all without a speculative config
            self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            self.accepted_per_pos = counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                ["position"],
            )
            for labels in each:
                for metric in (self.drafts, self.draft_tokens, self.accepted):
                    metric.labels(*labels)
                for position in range(self.k):
                    self.accepted_per_pos.labels(*labels, str(position))

        mfu = "(for Model Flops Utilization calculations)."
        idle_counter(
            "vllm:estimated_flops_per_gpu", f"Estimated number of floating point operations per GPU {mfu}"
        )
        idle_counter(
            "vllm:estimated_read_bytes_per_gpu", f"Estimated number of bytes read from memory per GPU {mfu}"
        )
        idle_counter(
            "vllm:estimated_write_bytes_per_gpu", f"Estimated number of bytes written to memory per GPU {mfu}"
        )

        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS, registry=r
        )
        self.waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            [*LABELS, "reason"],
            registry=r,
        )
        sleep_state = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*LABELS, "sleep_state"],
            registry=r,
        )
        for labels in each:
            sleep_state.labels(*labels, "awake").set(1)
            sleep_state.labels(*labels, "weights_offloaded")
            sleep_state.labels(*labels, "discard_all")
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS, registry=r
        )

        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        for labels in each:
            self.prefix_queries.labels(*labels)
            self.prefix_hits.labels(*labels)
        kv_connector = "from KV connector cross-instance cache sharing, in terms of number of"
        idle_counter(
            "vllm:external_prefix_cache_queries",
            f"External prefix cache queries {kv_connector} queried tokens.",
        )
        idle_counter(
            "vllm:external_prefix_cache_hits", f"External prefix cache hits {kv_connector} cached tokens."
        )
        idle_counter(
            "vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."
        )
        idle_counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"]
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        for labels in each:
            self.preemptions.labels(*labels)
            self.prompt_tokens.labels(*labels)
            self.prompt_cached.labels(*labels)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
                self.prompt_by_source.labels(*labels, source)
        self.cached_by_source = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded "
            "to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            ["source"],
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
        )
        for labels in each:
            for source in ("device", "host", "p2p", "disk", "external_unspecified"):
                self.cached_by_source.labels(*labels, source)
            self.generation_tokens.labels(*labels)
            for reason in FINISH_REASONS:
                self.success.labels(*labels, reason)
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],  # no engine label: rejected before reaching an engine
            registry=r,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model, reason)

        token_buckets = one_two_five(options.max_model_len)
        self.request_prompt = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.max_generation = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_BUCKETS,
        )
        self.request_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )
        cache_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted(cache_config_info(options, "0")),
            registry=r,
        )
        for _, engine in each:
            cache_info.labels(**cache_config_info(options, engine)).set(1)
        self.http = HttpMetrics(r)

    def attach(self, engines: Sequence[Engine]) -> None:
        """Read the gauges from the ``engines`` (by their index) at every scrape."""
        for engine in engines:
            labels = self._engines[engine.index]
            self.running.labels(*labels).set_function(_reader(engine, "num_running"))
            self.waiting.labels(*labels).set_function(_reader(engine, "num_waiting"))
            self.waiting_by_reason.labels(*labels, "capacity").set_function(_reader(engine, "num_waiting"))
            self.waiting_by_reason.labels(*labels, "deferred")
            self.kv_usage.labels(*labels).set_function(engine.kv_usage)

    def render(
        self, method: str, path: str, accept: str | None, accept_encoding: str | None
    ) -> tuple[bytes, dict[str, str]]:
        """The page and its headers, as vLLM answers ``method path`` with these request headers."""
        if method in ("GET", "HEAD") and path == "/metrics":
            return generate_latest(self.registry), {"Content-Type": CONTENT_TYPE_LATEST}
        encoder, content_type = choose_encoder(accept or "")
        body = encoder(self.registry)
        headers = {"Content-Type": content_type}
        if gzip_accepted(accept_encoding or ""):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return body, headers

    def observe_request(self, engine: int, n: int, max_generation_tokens: int) -> None:
        """A request and its ``n`` choices (vLLM's ParentRequest) finished: once per request."""
        labels = self._engines[engine]
        self.params_n.labels(*labels).observe(n)
        self.max_generation.labels(*labels).observe(max_generation_tokens)

    # --- EngineListener -----------------------------------------------------------------------------

    def on_step(self, step: EngineStep) -> None:
        labels = self._engines[step.engine]
        for out in step.outputs:
            if out.step.draft_tokens > 0:
                self.drafts.labels(*labels).inc()
                self.draft_tokens.labels(*labels).inc(out.step.draft_tokens)
                self.accepted.labels(*labels).inc(out.step.accepted)
                for position in range(out.step.accepted):
                    self.accepted_per_pos.labels(*labels, str(position)).inc()
            if out.first_token:
                prompt = out.record.prompt_tokens
                cached = out.record.cached_tokens
                self.prompt_tokens.labels(*labels).inc(prompt)
                self.prompt_by_source.labels(*labels, "local_compute").inc(prompt - cached)
                self.prompt_by_source.labels(*labels, "local_cache_hit").inc(cached)
                self.prompt_cached.labels(*labels).inc(cached)
                if self._prefix_caching:  # vLLM counts no query for a request that skips the lookup
                    self.prefix_queries.labels(*labels).inc(prompt)
                    self.prefix_hits.labels(*labels).inc(cached)
                self.cached_by_source.labels(*labels, "device").inc(cached)
                self.ttft.labels(*labels).observe(out.step.time - out.record.arrival_time)
            elif out.interval is not None:
                # One observation per output-producing step, however many tokens it carried (V1).
                self.itl.labels(*labels).observe(out.interval)
        self.generation_tokens.labels(*labels).inc(step.generated_tokens)
        computed = step.prompt_tokens - step.cached_tokens
        self.iteration_tokens.labels(*labels).observe(computed + step.generated_tokens)

    def on_preempted(self, engine: int, record: RequestRecord) -> None:
        self.preemptions.labels(*self._engines[engine]).inc()

    def on_finished(self, engine: int, record: RequestRecord) -> None:
        labels = self._engines[engine]
        self.success.labels(*labels, record.finish_reason or "abort").inc()
        if record.finish_reason == "abort" or record.first_token_time is None:
            return  # an aborted request's timings describe the client, not the engine
        assert record.scheduled_time is not None and record.finished_time is not None
        last_token = record.token_times[-1]
        decode = last_token - record.first_token_time
        self.e2e.labels(*labels).observe(record.finished_time - record.arrival_time)
        self.queue_time.labels(*labels).observe(record.scheduled_time - record.arrival_time)
        self.prefill_time.labels(*labels).observe(record.first_token_time - record.scheduled_time)
        self.decode_time.labels(*labels).observe(decode)
        self.inference_time.labels(*labels).observe(last_token - record.scheduled_time)
        # vLLM observes 0 for a one-token request (no interval to average).
        tpot = decode / (record.completion_tokens - 1) if record.completion_tokens > 1 else 0.0
        self.tpot.labels(*labels).observe(tpot)
        self.request_prompt.labels(*labels).observe(record.prompt_tokens)
        self.request_generation.labels(*labels).observe(record.completion_tokens)
        # The effective max_tokens (vLLM's sampling_params.max_tokens, after its defaults and the
        # clamp to the context window).
        self.params_max_tokens.labels(*labels).observe(record.max_tokens)
        self.request_preemptions.labels(*labels).observe(record.preemptions)
        self.prefill_kv_computed.labels(*labels).observe(record.prompt_tokens - record.cached_tokens)


class HttpMetrics:
    """prometheus-fastapi-instrumentator's default metrics, which vLLM's /metrics carries."""

    def __init__(self, registry: CollectorRegistry) -> None:
        size_note = "Only value of header is respected. Otherwise ignored. No percentile calculated. "
        self.requests = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ["method", "status", "handler"],
            registry=registry,
        )
        self.request_size = Summary(
            "http_request_size_bytes",
            f"Content length of incoming requests by handler. {size_note}",
            ["handler"],
            registry=registry,
        )
        self.response_size = Summary(
            "http_response_size_bytes",
            f"Content length of outgoing responses by handler. {size_note}",
            ["handler"],
            registry=registry,
        )
        self.duration_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
            buckets=HTTP_HIGHR_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
            ["handler", "method"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )

    def observe(
        self, handler: str, method: str, status: int, request_size: int, response_size: int, seconds: float
    ) -> None:
        if handler in HTTP_EXCLUDED:
            return
        self.requests.labels(method, f"{status // 100}xx", handler).inc()
        self.request_size.labels(handler).observe(request_size)
        self.response_size.labels(handler).observe(response_size)
        self.duration_highr.observe(seconds)
        self.duration.labels(handler, method).observe(seconds)


def _reader(engine: Engine, attribute: str) -> Callable[[], float]:
    return lambda: float(getattr(engine, attribute))


def cache_config_info(options: SimOptions, engine: str) -> dict[str, str]:
    """vLLM 0.32's CacheConfig labels, as the captured CPU server had them, sized from the options."""
    block_size = options.block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(options.enable_prefix_caching),
        "engine": engine,
        "gpu_memory_utilization": "0.92",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(options.kv_capacity_tokens / options.max_model_len),
        "kv_cache_memory_bytes": "1073741824",
        "kv_cache_size_tokens": str(options.kv_capacity_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(-(-options.kv_capacity_tokens // block_size)),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
