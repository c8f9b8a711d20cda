"""Give vLLM's own argument parser and config validation what `specguard serve-config` generated,
without starting an engine. Run under the interpreter that has vLLM:

    .venv-vllm/bin/python tests/e2e/vllm_parse_check.py CASES.json

CASES.json is a list of {"name", "form", "argv"}: ``form`` "serve" parses ``argv`` (without the
program) with the ``vllm serve`` subcommand's parser, as vLLM's CLI builds it; "api_server" with the
parser of ``python -m vllm.entrypoints.openai.api_server`` (in 0.32.0 its main is
``vllm.entrypoints.launchers.api_server.entry.main``: this parser, then ``validate_parsed_serve_args``). A ``--config FILE`` in argv is loaded by
vLLM's FlexibleArgumentParser as it does at start-up. Each parsed namespace then goes through
``EngineArgs.from_cli_args``, ``create_model_config`` (the target, read from its directory) and
``create_speculative_config`` (SpeculativeConfig's validation, the draft model's config included);
a k-per-batch-size schedule through vLLM's own schedule validation. Prints one JSON line per case:
the speculative config as vLLM holds it, or the error vLLM raised.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _parser(form: str) -> Any:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if form == "api_server":
        return make_arg_parser(FlexibleArgumentParser(description="api_server"))
    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    return top


def check(case: dict[str, Any]) -> dict[str, Any]:
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    args = _parser(case["form"]).parse_args(case["argv"])
    if case["form"] == "serve" and getattr(args, "model_tag", None):
        args.model = args.model_tag  # as ServeSubcommand.cmd does
    validate_parsed_serve_args(args)
    engine_args = EngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    parallel_config = ParallelConfig(tensor_parallel_size=engine_args.tensor_parallel_size)
    spec = engine_args.create_speculative_config(model_config, parallel_config)
    if spec is None:
        return {"name": case["name"], "speculative": None}
    schedule = spec.num_speculative_tokens_per_batch_size
    if schedule is not None:
        schedule = validate_and_normalize_dynamic_sd_schedule([list(entry) for entry in schedule])
    return {
        "name": case["name"],
        "model": model_config.model,
        "served_model_name": model_config.served_model_name,
        "max_model_len": model_config.max_model_len,
        "port": getattr(args, "port", None),
        "host": getattr(args, "host", None),
        "enable_prefix_caching": engine_args.enable_prefix_caching,
        "max_num_seqs": engine_args.max_num_seqs,
        "speculative": {
            "method": spec.method,
            "model": spec.model,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "prompt_lookup_max": spec.prompt_lookup_max,
            "prompt_lookup_min": spec.prompt_lookup_min,
            "num_speculative_tokens_per_batch_size": schedule,
            "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
        },
    }


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as handle:
        cases = json.load(handle)
    for case in cases:
        try:
            result = check(case)
        except BaseException as exc:  # SystemExit from argparse included: reported, not raised
            result = {"name": case["name"], "error": f"{type(exc).__name__}: {exc}"}
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
