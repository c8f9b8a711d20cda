"""The three artifacts of a checked serving file (a ``Plan``): vLLM's command line, its ``--config``
YAML and the environment file of the ``vllm_restart`` action. The environment file and the YAML's
``speculative-config`` are written by the action's own code (``render_env``, ``render_yaml``), so
what this command writes and what the daemon rewrites on a restart are the same form."""

from __future__ import annotations

import io
import json
import shlex
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from specguard.actions.vllm_restart.speculative import render_env, render_yaml
from specguard.playbook.serve_config.checks import Plan
from specguard.playbook.serve_config.versions import SHORT_FLAG_SINCE, show

API_SERVER = "vllm.entrypoints.openai.api_server"
LONG_FLAG = "--speculative-config"
SHORT_FLAG = "-sc"


class RenderError(ValueError):
    """An option of the rendering the version cannot take (``-sc`` before 0.19)."""


@dataclass(frozen=True)
class Launcher:
    """How vLLM is started: ``vllm serve TARGET`` (the console script), or, with ``python``, the
    module form ``PYTHON -m vllm.entrypoints.openai.api_server --model TARGET``."""

    python: str | None = None
    vllm: str = "vllm"

    def argv(self, target: str) -> list[str]:
        if self.python is not None:
            return [self.python, "-m", API_SERVER, "--model", target]
        return [self.vllm, "serve", target]


def speculative_flag(plan: Plan, short: bool) -> str:
    if not short:
        return LONG_FLAG
    if plan.facts < SHORT_FLAG_SINCE:
        raise RenderError(f"-sc needs vLLM {show(SHORT_FLAG_SINCE)} or later, not {plan.version_text}")
    return SHORT_FLAG


def options(plan: Plan) -> list[tuple[str, Any]]:
    """vLLM's options other than the model and the speculative config, in the order written."""
    s = plan.serving
    pairs: list[tuple[str, Any]] = [
        ("served-model-name", s.served_model_name),
        ("host", s.host),
        ("port", s.port),
        ("tensor-parallel-size", s.tensor_parallel_size),
        ("gpu-memory-utilization", s.gpu_memory_utilization),
        ("max-model-len", s.max_model_len),
    ]
    return [(name, value) for name, value in pairs if value is not None]


def spec_json(plan: Plan) -> str:
    return json.dumps(plan.speculative)


def command_argv(plan: Plan, launcher: Launcher = Launcher(), short: bool = False) -> list[str]:
    argv = launcher.argv(plan.serving.target)
    for name, value in options(plan):
        argv += [f"--{name}", str(value)]
    argv += [speculative_flag(plan, short), spec_json(plan)]
    argv += list(plan.serving.extra_args)
    return argv


def command_text(plan: Plan, launcher: Launcher = Launcher(), short: bool = False) -> str:
    """The command on one line, quoted for a POSIX shell (``shlex.split`` gives the argv back)."""
    return shlex.join(command_argv(plan, launcher, short))


def command_script(plan: Plan, source: str, launcher: Launcher = Launcher(), short: bool = False) -> str:
    return (
        "#!/bin/sh\n"
        f"# vLLM {plan.version_text}: {plan.serving.target} with {plan.serving.method} speculative decoding, "
        f"k = {plan.serving.num_speculative_tokens}\n"
        f"# Rendered by `specguard serve-config` from {source}; render it again rather than edit it.\n"
        f'exec {command_text(plan, launcher, short)} "$@"\n'
    )


# --- vLLM's --config YAML --------------------------------------------------------------------------


def extra_as_keys(extra: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """``extra_args`` as keys of vLLM's YAML (``--flag`` -> ``flag: true``, ``--flag V`` -> ``flag: V``,
    ``--flag A B`` -> a list), and the arguments that have no YAML form (short options, a flag given
    twice, a value with no flag), which stay on the command line."""
    keys: dict[str, Any] = {}
    left: list[str] = []
    index = 0
    while index < len(extra):
        item = extra[index]
        if not item.startswith("--") or len(item) == 2:
            left.append(item)
            index += 1
            continue
        name, sep, inline = item[2:].partition("=")
        values: list[str] = [inline] if sep else []
        index += 1
        if not sep:
            while index < len(extra) and not extra[index].startswith("-"):
                values.append(extra[index])
                index += 1
        if name in keys:
            left += [f"--{name}", *values] if not sep else [item]
            continue
        keys[name] = True if not values else values[0] if len(values) == 1 else values
    return keys, left


def _dump(data: CommentedMap) -> str:
    yaml = YAML()
    yaml.width = 4096
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def vllm_yaml(plan: Plan, source: str) -> str:
    """vLLM's options for ``vllm serve --config FILE``: the model and the serving file's options, its
    ``extra_args`` as keys, and ``speculative-config`` in the form this vLLM reads (a mapping from
    0.16, a JSON string before)."""
    data = CommentedMap()
    data["model"] = plan.serving.target
    for name, value in options(plan):
        data[name] = value
    keys, left = extra_as_keys(plan.serving.extra_args)
    for name, value in keys.items():
        data[name] = value
    text = render_yaml(_dump(data), plan.speculative, show(plan.facts), source)
    header = (
        f"# vLLM {plan.version_text}'s options: vllm serve --config THIS_FILE (or python -m {API_SERVER} --config "
        "THIS_FILE)\n"
        f"# Rendered by `specguard serve-config` from {source}.\n"
    )
    if left:
        header += (
            f"# Give these on the command line too (they have no form in this file): {shlex.join(left)}\n"
        )
    return header + text


def vllm_env(plan: Plan, source: str) -> str:
    """The environment file the vllm_restart action manages (``VLLM_SPECULATIVE_CONFIG``)."""
    note = (
        f"vLLM {plan.version_text}: the speculative config, rendered by `specguard serve-config` from {source}; "
        "the vllm_restart action rewrites it"
    )
    return render_env(plan.speculative, note)


def as_json(plan: Plan, source: str, launcher: Launcher, short: bool) -> dict[str, Any]:
    return {
        "vllm_version": plan.version_text,
        "rendered_as": show(plan.facts),
        "speculative_config": plan.speculative,
        "argv": command_argv(plan, launcher, short),
        "command": command_text(plan, launcher, short),
        "yaml": vllm_yaml(plan, source),
        "env": vllm_env(plan, source),
        "warnings": plan.warnings,
    }
