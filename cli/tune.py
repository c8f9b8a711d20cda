"""``specguard tune``: the k sweep (playbook phase 3). The command line: the config (the daemon's
address and token, the vllm_restart action, the rules to silence), bench's prompt and load
options, the sweep; ``playbook/tune/`` does the rest."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from specguard.cli.shared.options import add_config, who
from specguard.cli.shared.restarts import (
    ActionChoice,
    daemon_url,
    one_action,
    restart_actions,
    step_wait,
)

DESCRIPTION = """\
Find the best num_speculative_tokens (k) for this server and traffic. Predicted: one run at the
largest k of --sweep measures the per-position acceptance p_i of every smaller k (vLLM counts
position i the same whatever k is), and with the draft's cost c gives the expected speedup
(1 + sum p_i) / (1 + k c) of each k per traffic class, as the weekly report computes it. Measured:
the running daemon steps its vllm_restart action to each k (writes the config, restarts vLLM,
verifies, rolls back if it does not come up), and `bench` measures each k per class. The rules that
name the action are silenced while it runs. The original k is restored at the end, after a failure,
and on Ctrl-C or SIGTERM. With --write, the serving file gets the chosen k (and, for vLLM 0.25 and
later with several --concurrency levels, num_speculative_tokens_per_batch_size) and the baseline is
rewritten from the run at the chosen k; without --write nothing is edited.
"""

EPILOG = """\
examples:
  specguard tune --config /etc/specguard/specguard.yaml --url http://127.0.0.1:8000 --sweep 1,3,5
  specguard tune -c specguard.yaml --url http://127.0.0.1:8000 --sweep 1,3,5 --concurrency 1,4,16 \\
      --serving serving.yaml --baseline baseline.json --write
exit codes: 0 done; 2 bad input, or the sweep could not go on (the original k restored); 130 stopped
"""


def add_parser(sub: Any) -> None:
    from specguard.playbook.bench.prompts import CLASSES

    parser = sub.add_parser(
        "tune",
        help="sweep num_speculative_tokens through the daemon: predicted and measured speedup per k",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(parser)
    parser.add_argument("--url", required=True, help="the vLLM server the vllm_restart action restarts")
    parser.add_argument("--sweep", required=True, metavar="K,K,...",
                        help="k values to measure, rungs of the action's ladder, e.g. 1,3,5")  # fmt: skip
    parser.add_argument("--concurrency", default="4", metavar="N,N,...",
                        help="requests in flight; several levels give the per-batch-size table (default 4)")  # fmt: skip
    parser.add_argument("--action", metavar="NAME", help="which vllm_restart action (when there are several)")
    parser.add_argument("--against", metavar="URL",
                        help="a plain server (speculation off) as the reference; default: rung 0, if the ladder has it")  # fmt: skip
    parser.add_argument("--draft-cost", type=_cost, metavar="C", help="c, draft step / target step")
    parser.add_argument("--model", help="the served model name (default: the first of /v1/models)")
    parser.add_argument("--classes", help=f"built-in prompt classes (default: all: {', '.join(CLASSES)})")
    parser.add_argument("--num-prompts", type=_positive, default=100, metavar="N",
                        help="requests per k and concurrency, shared among the classes (default 100)")  # fmt: skip
    parser.add_argument("--max-tokens", type=_positive, default=128, metavar="N", help="default 128")
    parser.add_argument(
        "--warmup", type=int, default=2, metavar="N", help="per class, not counted (default 2)"
    )
    parser.add_argument("--seed", type=int, default=0, help="prompt order (default 0)")
    parser.add_argument("--settle", metavar="DURATION",
                        help="keep the rules silenced this long after the sweep (default: their longest window + for)")  # fmt: skip
    parser.add_argument("--serving", type=Path, metavar="FILE", help="the serving file --write updates")
    parser.add_argument("--baseline", type=Path, metavar="FILE",
                        help="the baseline file: its draft cost is used; --write rewrites its entry at the chosen k")  # fmt: skip
    parser.add_argument("--method", help="the speculative method, recorded in the baseline")
    parser.add_argument("--write", action="store_true", help="update --serving and --baseline")


def _ks(flag: str, text: str) -> tuple[int, ...]:
    """``1,3,5`` as (1, 3, 5); raises ValueError naming the flag."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: whole numbers, comma-separated, e.g. 1,3,5") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{flag} {text!r}: every value must be 1 or more (k <= 0 is no speculation to tune)")
    return tuple(sorted(set(values)))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _cost(text: str) -> float:
    value = float(text)
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError("a draft's cost is between 0 and 10")
    return value


def cmd_tune(args: argparse.Namespace) -> int:
    from specguard.config.loading import load
    from specguard.playbook.bench.load import Load
    from specguard.playbook.bench.prompts import PromptError, builtin
    from specguard.playbook.bench.runner import Options
    from specguard.playbook.tune.daemon import DaemonApi
    from specguard.playbook.tune.run import TuneOptions, tune
    from specguard.rules.durations import parse_duration

    def bad(line: str) -> int:
        print(f"specguard tune: {line}", file=sys.stderr)
        return 2

    try:
        sweep, concurrency = _ks("--sweep", args.sweep), _ks("--concurrency", args.concurrency)
    except ValueError as exc:
        return bad(str(exc))
    if args.write and args.serving is None and args.baseline is None:
        return bad("--write: give --serving FILE and/or --baseline FILE to update")
    loaded = load(args.config, (), {})
    if not loaded.ok:
        for problem in loaded.errors:
            print(f"specguard tune: {problem}", file=sys.stderr)
        return 2
    where = args.config or "the built-in defaults"
    try:
        found = restart_actions(
            loaded, args.action, where, ": tune steps k through one (see docs/vllm-restart.md)"
        )
        name, action = one_action(found, where)
    except ActionChoice as exc:
        return bad(f"--action: {exc}" if exc.kind == "unknown" else str(exc))
    rules = [lr.rule for lr in loaded.rules if name in lr.rule.actions and lr.rule.enabled]
    try:
        prompts = builtin(args.classes.split(",") if args.classes else None)
        settle = (
            parse_duration(args.settle)
            if args.settle
            else max((r.window + r.for_ for r in rules), default=0.0)
        )
    except (PromptError, ValueError) as exc:
        return bad(str(exc))
    try:
        baseline_cost = _baseline_cost(args, loaded)
    except ValueError as exc:
        return bad(str(exc))
    who_ = f"specguard tune ({who()})"
    api = DaemonApi(daemon_url(loaded.config), loaded.webhook_token, step_wait(action), who_)
    load_ = Load(concurrency=concurrency[0], num_prompts=args.num_prompts, warmup=max(0, args.warmup),
                 seed=args.seed)  # fmt: skip
    bench = Options(url=args.url.rstrip("/"), prompts=prompts, load=load_, model=args.model,
                    max_tokens=args.max_tokens, named_classes=tuple(args.classes.split(",")) if args.classes else ())  # fmt: skip
    options = TuneOptions(
        bench=bench, sweep=sweep, concurrency=concurrency, action=name, against=args.against,
        draft_cost=args.draft_cost, baseline_cost=baseline_cost, rules=tuple(r.name for r in rules),
        settle=settle, phase_seconds=action.p.timeout + 600, restart_guess=min(action.p.health_timeout, 120.0),
        serving=args.serving, baseline=args.baseline, write=args.write, method=args.method,
        store=loaded.config.store_file(),
    )  # fmt: skip
    return asyncio.run(tune(options, api, sys.stdout, sys.stderr))


def _baseline_cost(args: argparse.Namespace, loaded: Any) -> tuple[float, str] | None:
    """c from --baseline (when it exists) or the config's baseline: the entry for --model."""
    import json

    from pydantic import ValidationError

    from specguard.store.baseline import parse_baseline

    labels = {"model_name": args.model} if args.model else {}
    if args.baseline is not None and args.baseline.exists():
        try:
            baseline = parse_baseline(json.loads(args.baseline.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
            first = str(exc).splitlines()[0]
            raise ValueError(f"--baseline {args.baseline}: not a baseline file ({first})") from None
        where = str(args.baseline)
    elif loaded.baseline is not None:
        baseline, where = loaded.baseline, str(loaded.config.baseline)
    else:
        return None
    cost = baseline.draft_cost(labels)
    return (cost, f"baseline {where}") if isinstance(cost, float) else None
