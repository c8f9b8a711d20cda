"""``specguard bench``: the command line, the live progress line, the summary table and the JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from specguard.playbook.bench.load import Load
from specguard.playbook.bench.progress import ProgressLine
from specguard.playbook.bench.prompts import CLASSES, PromptError, builtin, load_file
from specguard.playbook.bench.routing import routing_table
from specguard.playbook.bench.runner import BenchError, Options, bench
from specguard.playbook.bench.stats import summarize

DESCRIPTION = """\
Measure a vLLM server as its clients see it, through its OpenAI API (streamed, with usage):
TTFT, TPOT ((e2e - TTFT) / (output tokens - 1), tokens from usage, never from counting chunks),
inter-token latency per chunk and per token, end-to-end latency, throughput and errors by kind;
and, from the server's /metrics before and after each phase, the acceptance of exactly that phase
and vLLM's own latency histograms read as specguard's rules read them (histogram_quantile inside
vLLM's buckets, which reads higher than a client's timing). Built-in prompt sets per traffic class
(chat, code, summarization, multilingual, long_context), or your own (JSONL, or ShareGPT-style
JSON); prompts that cannot fit the server's max_model_len with their output are left out, with a
line saying so. --against runs the same prompts on a second server (speculative decoding off) and
gives the speedup per class; --write-baseline writes the baseline the latency rules read: vLLM's
histogram figures, with the client's beside them. Pointed at specguard's router, each request's
routing class and pool (its X-Specguard-Class / X-Specguard-Pool headers) are recorded and the
figures are also given per routing class (--metrics-url: read the speculative server's counters).
"""

EPILOG = """\
examples:
  specguard bench --url http://127.0.0.1:8000 --num-prompts 200 --concurrency 8
  specguard bench --url http://127.0.0.1:8000 --classes code,chat --request-rate 4 --duration 2m
  specguard bench --url http://10.0.0.7:8000 --against http://10.0.0.8:8000 --write-baseline baseline.json --method eagle3
"""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "bench",
        help="measure a vLLM server's latency and acceptance per traffic class; write the baseline",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    parser.add_argument("--api", choices=["completions", "chat"], default="completions",
                        help="/v1/completions (default) or /v1/chat/completions")  # fmt: skip
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--classes", help=f"built-in prompt classes, comma-separated (default: all: {', '.join(CLASSES)})"
    )
    what.add_argument(
        "--prompts", type=Path, metavar="FILE", help="your prompts: JSONL, or ShareGPT-style JSON"
    )
    parser.add_argument("--no-per-class", dest="per_class", action="store_false",
                        help="one phase for all prompts instead of one per class")  # fmt: skip
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=_positive_int, metavar="N", help="requests in flight (default 4)")
    load.add_argument(
        "--request-rate", type=_positive_float, metavar="R", help="arrivals per second (gamma gaps)"
    )
    parser.add_argument(
        "--max-concurrency", type=_positive_int, metavar="N", help="with --request-rate: at most N in flight"
    )
    parser.add_argument("--burstiness", type=_positive_float, default=1.0,
                        help="with --request-rate: 1 is Poisson; below 1 burstier, above more even")  # fmt: skip
    count = parser.add_mutually_exclusive_group()
    count.add_argument(
        "--num-prompts",
        type=_positive_int,
        metavar="N",
        help="requests in all, shared evenly among the classes, as vllm bench serve counts them "
        "(default: each prompt once)",
    )
    count.add_argument(
        "--duration", metavar="DURATION", help="measured time of each class (each phase), e.g. 2m"
    )
    parser.add_argument(
        "--warmup",
        type=_count,
        default=2,
        metavar="N",
        help="requests of each class (each phase) before measuring, not counted (default 2)",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0)")
    parser.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=128,
        metavar="N",
        help="output tokens per request (default 128)",
    )
    parser.add_argument("--seed", type=int, default=0,
                        help="prompt order, arrival times and, above temperature 0, sampling (default 0)")  # fmt: skip
    parser.add_argument(
        "--timeout", type=_positive_float, default=300.0, metavar="SECONDS", help="per request (default 300)"
    )
    parser.add_argument(
        "--against", metavar="URL", help="a second server (speculative decoding off): speedup per class"
    )
    parser.add_argument(
        "--write-baseline", type=Path, metavar="FILE", help="write (or update, per model) this baseline file"
    )
    parser.add_argument(
        "--method", help="the speculative method, recorded in the baseline (e.g. eagle3, draft_model)"
    )
    parser.add_argument(
        "--allow-partial", action="store_true", help="write the baseline even if requests failed"
    )
    parser.add_argument(
        "--metrics-url",
        metavar="URL",
        help="read the acceptance counters and histograms from this server's /metrics instead of "
        "--url's (through specguard's router: the speculative server, e.g. http://127.0.0.1:8000)",
    )
    parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def cmd_bench(args: argparse.Namespace) -> int:
    from specguard.rules.durations import parse_duration

    try:
        if args.prompts is not None:
            prompts = load_file(args.prompts)
        else:
            prompts = builtin(args.classes.split(",") if args.classes else None)
        duration = parse_duration(args.duration) if args.duration else None
    except (PromptError, ValueError) as exc:
        print(f"specguard bench: {exc}", file=sys.stderr)
        return 2
    if args.max_concurrency and args.request_rate is None:
        print(
            "specguard bench: --max-concurrency goes with --request-rate (else use --concurrency)",
            file=sys.stderr,
        )
        return 2
    load = Load(
        concurrency=args.max_concurrency if args.request_rate else (args.concurrency or 4),
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        num_prompts=args.num_prompts,
        duration=duration,
        warmup=args.warmup,
        seed=args.seed,
    )
    options = Options(
        url=args.url.rstrip("/"), prompts=prompts, load=load, model=args.model, api=args.api,
        per_class=args.per_class, temperature=args.temperature,
        max_tokens=args.max_tokens, timeout=args.timeout, against=args.against,
        named_classes=tuple(args.classes.split(",")) if args.classes else (),
        source=str(args.prompts) if args.prompts is not None else "", metrics_url=args.metrics_url,
    )  # fmt: skip
    line = ProgressLine(sys.stderr, show=sys.stderr.isatty())
    started = time.time()
    try:
        report = asyncio.run(bench(options, line))
    except BenchError as exc:
        line.clear()
        print(f"specguard bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # what was measured so far, and no baseline from it
        line.clear()
        _table({k: {"summary": summarize(r, line.elapsed(k)), "acceptance": None} for k, r in line.results.items()},
               sys.stdout)  # fmt: skip
        print("specguard bench: interrupted: the figures above are of the requests answered so far; "
              "no baseline written", file=sys.stderr)  # fmt: skip
        return 130
    line.clear()
    measured_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    if args.json:
        print(json.dumps(_plain(report), indent=2))
    else:
        print_summary(report, sys.stdout)
    code = 0
    if report["partial"]:
        print("specguard bench: some requests failed (see errors above)", file=sys.stderr)
        code = 1
    if args.write_baseline is not None:
        code = max(code, _write(args, report, measured_at))
    return code


def _write(args: argparse.Namespace, report: dict[str, Any], measured_at: str) -> int:
    from specguard.playbook.bench.baseline import BaselineWriteError, entry, write

    if report["partial"] and not args.allow_partial:
        print(f"specguard bench: not writing {args.write_baseline} from a run with failed requests "
              "(--allow-partial writes it anyway)", file=sys.stderr)  # fmt: skip
        return 1
    made = entry(report, args.method, measured_at)
    try:
        said = write(args.write_baseline, made, measured_at)
    except BaselineWriteError as exc:
        print(f"specguard bench: {exc}", file=sys.stderr)
        return 1
    print(f"baseline: {said}", file=sys.stderr)
    if not made["signals"]:
        print("specguard bench: warning: the server's /metrics gave no latency histograms, so the "
              "baseline holds client figures only (under `client`), which no rule compares with",
              file=sys.stderr)  # fmt: skip
    return 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def print_summary(report: dict[str, Any], out: TextIO) -> None:
    server = report["server"]
    spec = f"k={server['draft_positions']}" if server["draft_positions"] else "no speculative decoding"
    out.write(f"{server['url']}  model {server['model']}  vLLM {server['vllm_version'] or '?'}  {spec}\n\n")
    _table(report["phases"], out)
    _histogram_table(report["phases"], report["overall"], out)
    if "routing" in report:
        routing_table(report["routing"], out)
    against = report.get("against")
    if against:
        out.write(
            f"\nagainst {against['url']}  model {against['model']}  vLLM {against['vllm_version'] or '?'}\n\n"
        )
        _table(against["phases"], out)
        _histogram_table(against["phases"], against["overall"], out)
        out.write("\nspeedup (median TPOT and e2e of the second server over the first's)\n")
        rows = [("CLASS", "TPOT", "E2E", "GAINS", "DRAFT COST c")]
        for klass, row in report["comparison"].items():
            rows.append((klass, _x(row["tpot_speedup"]), _x(row["e2e_speedup"]), "yes" if row["gains"] else "NO",
                         f"{row['draft_cost']:.3f}" if "draft_cost" in row else "-"))  # fmt: skip
        _columns(rows, out)
        for klass, row in report["comparison"].items():
            if "draft_cost_unknown" in row:
                out.write(f"no draft cost for {klass}: {row['draft_cost_unknown']}\n")
        losers = [k for k, row in report["comparison"].items() if not row["gains"]]
        if losers:
            out.write(f"\nslower with speculation: {', '.join(losers)}: route them to standard decoding\n")


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _table(phases: dict[str, Any], out: TextIO) -> None:
    rows = [("CLASS", "OK/REQ", "TTFT p50/p95 ms", "TPOT p50/p95 ms", "ITL p50 ms", "E2E p50/p95 s",
             "TOK/S", "ACCEPT", "MAL", "PER POSITION")]  # fmt: skip
    for klass, phase in phases.items():
        s, a = phase["summary"], phase["acceptance"] or {}
        e2e = s["e2e"]
        rows.append((
            klass, f"{s['completed']}/{s['requests']}",
            f"{_ms(s['ttft']['p50'])}/{_ms(s['ttft']['p95'])}", f"{_ms(s['tpot']['p50'])}/{_ms(s['tpot']['p95'])}",
            _ms(s["itl"]["p50"]),
            "-" if e2e["p50"] is None else f"{e2e['p50']:.2f}/{e2e['p95']:.2f}",
            "-" if s["output_throughput"] is None else f"{s['output_throughput']:.0f}",
            f"{a['rate']:.2f}" if "rate" in a else "-",
            f"{a['mean_acceptance_length']:.2f}" if "mean_acceptance_length" in a else "-",
            " ".join(f"{p:.2f}" for p in a.get("per_position", [])) or "-",
        ))  # fmt: skip
    _columns(rows, out)
    for klass, phase in phases.items():
        for kind, count in phase["summary"]["errors"].items():
            out.write(
                f"  {klass}: {count} {kind} error(s), e.g. {phase['summary']['error_examples'][kind]}\n"
            )


def _histogram_table(phases: dict[str, Any], overall: dict[str, Any], out: TextIO) -> None:
    """vLLM's histograms read as the rules read them, beside what the client timed: the baseline's
    figures, and how far apart the two are."""
    rows = [("CLASS", "E2E p50/p95 s", "E2E MEAN s", "TPOT p50/MEAN ms", "TOK/S")]
    shown = {klass: phase["server"] for klass, phase in phases.items()}
    if len(phases) > 1:
        shown["together"] = overall["server"]
    if not any(shown.values()):
        out.write(
            "\nvLLM's /metrics gave no latency histograms: no figure the latency rules could compare with\n"
        )
        return
    out.write("\nvLLM's histograms, as the rules read them (histogram_quantile inside vLLM's buckets)\n")
    for klass, figures in shown.items():
        rows.append((
            klass,
            f"{_s(figures.get('e2e_latency_p50'))}/{_s(figures.get('e2e_latency_p95'))}",
            _s(figures.get("e2e_latency_mean")),
            f"{_ms(figures.get('tpot_p50'))}/{_ms(figures.get('tpot_mean'))}",
            "-" if figures.get("generation_throughput") is None else f"{figures['generation_throughput']:.0f}",
        ))  # fmt: skip
    _columns(rows, out)
    client, server = overall["client"], overall["server"]
    if client.get("e2e_latency_p95") and server.get("e2e_latency_p95"):
        gap = server["e2e_latency_p95"] / client["e2e_latency_p95"] - 1
        out.write(f"  e2e p95: {server['e2e_latency_p95']:.3f} s from the histogram, {client['e2e_latency_p95']:.3f} s "
                  f"as the client timed it ({gap:+.0%})\n")  # fmt: skip
    for klass, phase in phases.items():
        if "server_note" in phase:
            out.write(f"  {klass}: {phase['server_note']}\n")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _columns(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n")


def _plain(report: dict[str, Any]) -> dict[str, Any]:
    """The report without the per-request results (kept for the baseline), for --json."""

    def phases(items: dict[str, Any]) -> dict[str, Any]:
        return {k: {key: v for key, v in phase.items() if key != "results"} for k, phase in items.items()}

    out = {**report, "phases": phases(report["phases"])}
    if "against" in report:
        out["against"] = {**report["against"], "phases": phases(report["against"]["phases"])}
    return out
