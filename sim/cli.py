"""``specguard simulate`` (and ``python -m specguard.sim``): run a vLLM-compatible simulator in the foreground.

Arguments mirror ``vllm serve`` where they overlap, so a vLLM command line or ``--config`` file can
be pointed at the simulator; the rest are the knobs of the decoding model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from specguard.common import logs
from specguard.common.yamlfile import FileProblems
from specguard.sim import vllm_args
from specguard.sim.options import (
    DEFAULT_ACCEPTANCE,
    DEFAULT_BATCH_SLOWDOWN,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_KV_CAPACITY_TOKENS,
    DEFAULT_MAX_LOGPROBS,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MEAN_OUTPUT_TOKENS,
    DEFAULT_PREFILL_TOKENS_PER_STEP,
    DEFAULT_TEMPERATURE_DECAY,
    OptionsError,
    SimOptions,
    ignored_config_keys,
    options_from_args,
    parse_acceptance_list,
    parse_probability,
)
from specguard.sim.server import start_simulator

log = logging.getLogger("sim")

PROG = "specguard simulate"
DESCRIPTION = """\
Run a simulated vLLM 0.32 server: the OpenAI-compatible API (chat and completions, streaming or
not), /health, /version, /v1/models, /tokenize and a /metrics page with the same families,
labels and buckets as a real vLLM's, driven by a model of speculative decoding. Use it to try specguard rules
without a GPU. Stops cleanly on SIGINT/SIGTERM (exit 0); a scenario's `die` exits 1.
"""

EPILOG = """\
examples:
  specguard simulate --speculative-config '{"method": "eagle3", "model": "draft", "num_speculative_tokens": 3}'
  specguard simulate -sc '{"method": "ngram", "num_speculative_tokens": 4}' --acceptance 0.6 --port 8001
  specguard simulate --speculative-config.method ngram --speculative-config.num_speculative_tokens 4
  specguard simulate --spec-method ngram --spec-tokens 4 --data-parallel-size 2
  specguard simulate --config vllm.yaml --scenario sim/examples/scenario-acceptance-drop.yaml --ground-truth truth.jsonl

The speculative config is assembled as vLLM 0.32 does it: the --config file's, replaced by
--speculative-config/-sc, replaced in turn by the dotted --speculative-config.KEY VALUE form (the
dotted keys are merged with each other, not with the JSON); --spec-method, --spec-model and
--spec-tokens then add their key and refuse one that is already set.

Per-request truth (tokens, accepted drafts per step) is at GET /sim/ground-truth.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = parser.description or DESCRIPTION
    parser.epilog = parser.epilog or EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter

    vllm = parser.add_argument_group("vLLM options (as `vllm serve` takes them)")
    vllm.add_argument("--model", metavar="NAME", help="served model name (default: tiny-llama)")
    vllm.add_argument("--host", metavar="HOST", help="address to listen on (default: 127.0.0.1)")
    vllm.add_argument(
        "--port", type=int, metavar="N", help="port to listen on; 0 lets the OS pick (default: 8000)"
    )
    vllm.add_argument(
        "--speculative-config",
        "-sc",
        metavar="JSON",
        help='vLLM\'s speculative config, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\', or '
        "key by key: --speculative-config.method ngram; num_speculative_tokens (> 0) sets k. "
        "Without it: plain decoding and no spec_decode metrics",
    )
    vllm.add_argument(
        "--spec-method", metavar="METHOD", help="the speculative config's method (vLLM >= 0.22)"
    )
    vllm.add_argument("--spec-model", metavar="MODEL", help="the speculative config's draft model")
    vllm.add_argument(
        "--spec-tokens", type=int, metavar="K", help="the speculative config's num_speculative_tokens"
    )
    vllm.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="vLLM-style YAML file (.yaml/.yml) whose keys are these options without dashes "
        "(model, port, speculative-config as JSON string or mapping...); the command line wins",
    )
    vllm.add_argument(
        "--max-num-seqs",
        type=int,
        metavar="N",
        help=f"most requests running at once (default: {DEFAULT_MAX_NUM_SEQS})",
    )
    vllm.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help=f"context window: prompt + completion tokens (default: {DEFAULT_MAX_MODEL_LEN})",
    )
    vllm.add_argument(
        "--data-parallel-size",
        "-dp",
        type=int,
        metavar="N",
        help="engines behind the one API server, each with its own scheduler, KV cache and `engine` "
        "label; requests go to the least loaded (default: 1)",
    )
    vllm.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help=f"tokens per KV-cache block; the prefix cache reuses whole blocks (default: {DEFAULT_BLOCK_SIZE})",
    )
    vllm.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse the KV cache of prompt blocks seen before (default: on, as in vLLM)",
    )
    vllm.add_argument(
        "--max-logprobs",
        type=int,
        metavar="N",
        help=f"most logprobs a request may ask for (default: {DEFAULT_MAX_LOGPROBS})",
    )
    vllm.add_argument("--seed", type=int, metavar="N", help="seed for acceptance draws and generated text")

    model = parser.add_argument_group("decoding model")
    acceptance = model.add_mutually_exclusive_group()
    acceptance.add_argument(
        "--acceptance",
        type=parse_probability,
        metavar="A",
        help=f"conditional acceptance of every draft position at temperature 0, in [0, 1] "
        f"(default: {DEFAULT_ACCEPTANCE})",
    )
    acceptance.add_argument(
        "--acceptance-by-position",
        type=parse_acceptance_list,
        metavar="A1,A2,...",
        help="conditional acceptance per draft position at temperature 0 (position i given 0..i-1 "
        "accepted); the last value repeats for later positions",
    )
    model.add_argument(
        "--temperature-decay",
        type=float,
        metavar="D",
        help=f"acceptance at temperature T is A * exp(-D * T) (default: {DEFAULT_TEMPERATURE_DECAY}, "
        "about what EAGLE reports between T=0 and T=1; 1.5 mimics a random self-draft)",
    )
    model.add_argument(
        "--acceptance-spread",
        type=float,
        metavar="SD",
        help="standard deviation of a request's own acceptance around the configured one (a Beta per "
        "request; default 0: every request alike). Real traffic differs by request, so a window's "
        "tokens are not independent: 0.1 is a plausible mix",
    )
    model.add_argument(
        "--step-time", type=float, metavar="SECONDS", help="target model step time at batch 1 (default: 0.02)"
    )
    model.add_argument(
        "--draft-cost", type=float, metavar="C", help="draft step time / target step time (default: 0.05)"
    )
    model.add_argument(
        "--batch-slowdown",
        type=float,
        metavar="F",
        help=f"step time grows by this fraction per extra running request (default: {DEFAULT_BATCH_SLOWDOWN})",
    )
    model.add_argument(
        "--verify-token-cost",
        type=float,
        metavar="F",
        help="a target step's compute share per token it verifies: a step verifies k + 1 tokens of "
        "every running request, and once running * (k + 1) * F exceeds the memory-bound step, decode is "
        "compute-bound and each drafted token costs F of a step, so the best k falls as batches grow "
        "(default: 0, never compute-bound)",
    )
    model.add_argument(
        "--kv-capacity-tokens",
        type=int,
        metavar="N",
        help=f"KV-cache size in tokens; beyond it requests wait or are preempted (default: {DEFAULT_KV_CAPACITY_TOKENS})",
    )
    model.add_argument(
        "--prefill-tokens-per-step",
        type=int,
        metavar="N",
        help=f"prompt tokens one step's time prefills (default: {DEFAULT_PREFILL_TOKENS_PER_STEP})",
    )
    model.add_argument(
        "--mean-output-tokens",
        type=float,
        metavar="N",
        help=f"mean response length to EOS when a request sets no ignore_eos (default: {DEFAULT_MEAN_OUTPUT_TOKENS})",
    )

    run_group = parser.add_argument_group("simulation")
    run_group.add_argument(
        "--startup-delay",
        type=float,
        metavar="SECONDS",
        help="'load the model' this long before opening the port (connection refused meanwhile, like vLLM)",
    )
    run_group.add_argument(
        "--scenario",
        type=Path,
        metavar="FILE",
        help="YAML timeline of changes: acceptance, kv_usage ramps, die",
    )
    run_group.add_argument(
        "--ground-truth", type=Path, metavar="FILE", help="append every finished request as a JSON line here"
    )
    run_group.add_argument(
        "--lifecycle-log",
        type=Path,
        metavar="FILE",
        help="append a JSON line here at each change of the server's life (loading, serving, stopping, "
        "stopped; with the time, the pid and k): a restart's downtime, as the server saw it",
    )


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` rewritten as vLLM's parser rewrites it (sim.vllm_args), then parsed by ``parser``.

    Duplicate dotted keys are logged as vLLM logs them; argparse exits (status 2) on bad arguments.
    """
    try:
        rewritten, duplicates = vllm_args.rewrite(argv)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if duplicates:
        log.warning("Found duplicate keys %s", ", ".join(duplicates))
    return parser.parse_args(rewritten)


def parse_options(argv: Sequence[str]) -> SimOptions:
    """SimOptions from a command line as ``specguard simulate`` takes it (for embedding and tests).

    Raises OptionsError or FileProblems; argparse exits (status 2) on malformed arguments.
    """
    parser = argparse.ArgumentParser(prog=PROG)
    add_arguments(parser)
    return options_from_args(parse_args(parser, argv))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (exit 0). Bad options or files: a message on stderr, exit 2."""
    try:
        options = options_from_args(args)
        ignored = ignored_config_keys(args)
    except OptionsError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except FileProblems as exc:
        for problem in exc.problems:
            print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    lifecycle: Path | None = getattr(args, "lifecycle_log", None)
    if lifecycle is not None:
        try:  # said now, not as a traceback at the first line
            with lifecycle.open("a", encoding="utf-8"):
                pass
        except OSError as exc:
            print(
                f"{PROG}: --lifecycle-log: cannot write {lifecycle}: {exc.strerror or exc}", file=sys.stderr
            )
            return 2
    if not logging.getLogger().handlers:
        logs.setup("auto", "info")
    if ignored:
        log.info("config file: not simulated, ignored: %s", ", ".join(ignored))
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve(options, lifecycle))
    return 0


def _lifecycle(path: Path | None, event: str, k: int) -> None:
    """One line of the lifecycle log (appended and flushed at once: a reader samples it live)."""
    if path is None:
        return
    with path.open("a", encoding="utf-8") as log_file:
        log_file.write(json.dumps({"event": event, "at": time.time(), "pid": os.getpid(), "k": k}) + "\n")


async def _serve(options: SimOptions, lifecycle: Path | None = None) -> int:
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    k = options.num_speculative_tokens

    def stop() -> None:
        if not stop_requested.is_set():
            _lifecycle(lifecycle, "stopping", k)
        stop_requested.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop)
    _lifecycle(lifecycle, "loading", k)
    if options.startup_delay > 0:
        log.info("loading: the port opens in %gs", options.startup_delay)
    starting = asyncio.create_task(start_simulator(options))
    stopping = asyncio.create_task(stop_requested.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # stopped while "loading"
            _lifecycle(lifecycle, "stopped", k)
            return 0
        try:
            simulator = starting.result()
        except OSError as exc:
            print(
                f"{PROG}: cannot listen on {options.host}:{options.port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
        _lifecycle(lifecycle, "serving", k)
        log.info(
            "serving %s on %s (%s%s)",
            options.model,
            simulator.url,
            f"speculative decoding, k={k}" if k else "no speculative decoding",
            f", {options.data_parallel_size} engines" if options.data_parallel_size > 1 else "",
        )
        closed = asyncio.create_task(simulator.wait_closed())
        try:
            await asyncio.wait({stopping, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        await simulator.stop()
        _lifecycle(lifecycle, "stopped", k)
        if simulator.died:
            print(f"{PROG}: the simulated vLLM died (scenario `die`)", file=sys.stderr)
            return 1
        log.info("stopped")
        return 0
    finally:
        for task in (starting, stopping):
            task.cancel()
        await asyncio.gather(starting, stopping, return_exceptions=True)
