"""``specguard serve-config``: a serving file (or an old vLLM command) rendered for one vLLM version
as vLLM's command line, its ``--config`` YAML and the vllm_restart action's environment file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Render one serving file (target, draft, method, k, parallelism, memory, context, port) for a vLLM
version: the command line (--speculative-config JSON, or -sc from 0.19), the YAML for
`vllm serve --config FILE` (speculative-config a mapping from 0.16, a JSON string before) and the
environment file the vllm_restart action manages (VLLM_SPECULATIVE_CONFIG). The version decides
which methods and speculative-config keys exist: a method or key that version does not have or
refuses is an error; a key it would ignore is left out, with a warning. --from-legacy reads a
command written for the old separate flags (--speculative-model, --num-speculative-tokens...) and
says which flags were dropped and why; --write-serving keeps what it read as a serving file.
Warnings and dropped flags go to stderr; bad input is one line per problem and exit status 2,
with nothing written.
"""

EPILOG = """\
examples:
  specguard serve-config serving.yaml --vllm-version 0.32.0
  specguard serve-config serving.yaml --url http://127.0.0.1:8000 --format command
  specguard serve-config serving.yaml --vllm-version 0.15.1 --out /etc/vllm/specguard
  specguard serve-config --vllm-version 0.32.0 --write-serving serving.yaml --from-legacy \\
      "vllm serve /models/target --speculative-model /models/draft --num-speculative-tokens 5"

The version comes from --vllm-version, else --url (a running server's /version), else the
serving file's vllm_version.
"""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "serve-config",
        help="render a serving file as vLLM's command line, --config YAML and env file, for a vLLM version",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "serving", nargs="?", type=Path, metavar="SERVING_FILE", help="the serving file (YAML)"
    )
    parser.add_argument(
        "--from-legacy",
        metavar="COMMAND",
        help="instead of a serving file: a vLLM command with the old flags",
    )
    parser.add_argument(
        "--write-serving",
        type=Path,
        metavar="FILE",
        help="with --from-legacy: write what it read as a serving file",
    )
    version = parser.add_mutually_exclusive_group()
    version.add_argument(
        "--vllm-version", metavar="X.Y.Z", help="the vLLM version to render for, e.g. 0.32.0"
    )
    version.add_argument("--url", help="read the version from this running vLLM's /version")
    parser.add_argument(
        "--format",
        choices=["all", "command", "yaml", "env", "json"],
        default="all",
        help="what to print: all three artifacts (default), one of them, or everything as JSON",
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="write vllm.yaml, vllm.env and command.sh into DIR instead"
    )
    parser.add_argument("--force", action="store_true", help="replace files that are there already")
    parser.add_argument(
        "--short-flag", action="store_true", help="write -sc rather than --speculative-config (vLLM 0.19+)"
    )
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="start vLLM as PATH -m vllm.entrypoints.openai.api_server --model TARGET (default: vllm serve TARGET)",
    )


def _fail(lines: list[str] | str) -> int:
    for line in [lines] if isinstance(lines, str) else lines:
        print(f"specguard serve-config: {line}", file=sys.stderr)
    return 2


def cmd_serve_config(args: argparse.Namespace) -> int:
    from specguard.common.yamlfile import FileProblems
    from specguard.playbook.serve_config import checks, legacy, output, render, serving, versions

    if (args.serving is None) == (args.from_legacy is None):
        return _fail("give a serving file, or --from-legacy COMMAND (one of them)")
    if args.write_serving is not None and args.from_legacy is None:
        return _fail("--write-serving goes with --from-legacy")
    label = f"--vllm-version {args.vllm_version}" if args.vllm_version is not None else f"--url {args.url}"
    try:
        asked, label = _version(args, output)
        facts = versions.covered(asked) if asked is not None else None
        parsed: legacy.Legacy | None = None
        if args.from_legacy is not None:
            if facts is None:
                return _fail("--from-legacy needs the target version: --vllm-version or --url")
            parsed = legacy.parse_legacy(args.from_legacy, facts)
            source = "--from-legacy"
            spec = serving.parse_serving(parsed.data, source)
        else:
            source = str(args.serving)
            spec = serving.load_serving(args.serving)
        if asked is None:
            if spec.vllm_version is None:
                return _fail(
                    f"{source}: no vLLM version: give --vllm-version, --url, or the file's vllm_version"
                )
            label = f"{source}: vllm_version"
            asked = versions.parse_version(spec.vllm_version)
        plan = checks.plan(spec, asked)
        launcher = render.Launcher(python=args.python)
        command = render.command_text(plan, launcher, args.short_flag)
        yaml_text = render.vllm_yaml(plan, source)
        env_text = render.vllm_env(plan, source)
        files: dict[Path, str] = {}
        if args.out is not None:
            script = render.command_script(plan, source, launcher, args.short_flag)
            files.update(output.out_files(args.out, yaml_text, env_text, script))
        if args.write_serving is not None and parsed is not None:
            files[args.write_serving] = legacy.serving_yaml(parsed.data, asked, args.from_legacy)
        output.check_writable(files, args.force)
    except versions.VersionError as exc:
        return _fail(f"{label}: {exc}")
    except FileProblems as exc:
        return _fail([str(p) for p in exc.problems])
    except (legacy.LegacyError, output.OutputError, render.RenderError) as exc:
        prefix = "--from-legacy: " if isinstance(exc, legacy.LegacyError) else ""
        return _fail(f"{prefix}{exc}")

    for line in plan.warnings:
        print(f"specguard serve-config: warning: {line}", file=sys.stderr)
    if parsed is not None:
        for line in [*parsed.dropped, *parsed.notes]:
            print(f"specguard serve-config: {line}", file=sys.stderr)
    if files:
        try:
            output.write_files(files)
        except OSError as exc:
            return _fail(f"cannot write: {exc}")
        for path in files:
            print(f"wrote {path}")
        if args.out is not None:
            print(output.restart_settings(args.out))
            return 0
    _print(args.format, plan, source, launcher, args.short_flag, command, yaml_text, env_text)
    return 0


def _version(args: argparse.Namespace, output: Any) -> tuple[Any, str]:
    from specguard.playbook.serve_config.versions import parse_version

    if args.vllm_version is not None:
        return parse_version(args.vllm_version), f"--vllm-version {args.vllm_version}"
    if args.url is not None:
        text = output.fetch_version(args.url)
        return parse_version(text), f"--url {args.url} (/version {text})"
    return None, ""


def _print(
    what: str, plan: Any, source: str, launcher: Any, short: bool, command: str, yaml_text: str, env_text: str
) -> None:
    from specguard.playbook.serve_config import render

    if what == "json":
        print(json.dumps(render.as_json(plan, source, launcher, short), indent=2))
    elif what == "command":
        print(command)
    elif what == "yaml":
        print(yaml_text, end="")
    elif what == "env":
        print(env_text, end="")
    else:
        version = plan.version_text
        print(f"==> command line (vLLM {version}) <==\n{command}\n")
        print(f"==> vllm.yaml (vLLM {version}: vllm serve --config vllm.yaml) <==\n{yaml_text}")
        print(
            f"==> vllm.env (the vllm_restart action's env_file: VLLM_SPECULATIVE_CONFIG) <==\n{env_text}",
            end="",
        )
