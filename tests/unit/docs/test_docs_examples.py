"""The examples in README.md and docs/ work as written (tests/docs_pages.py says how they are read).

Configs and rule files go through the loader `specguard check` runs (all of `check` but its look at
this machine's state directory); baselines through the baseline's own validation; commands through
specguard's own argument parser, and their subcommands and flags must exist by their full names. A
block checked less than in full carries a docs-check marker, and the markers are counted here: a new
one changes the count below.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from specguard.cli.entry import build_parser
from specguard.config.loading import load
from specguard.config.schema import Config
from specguard.playbook.serve_config.serving import Serving, load_serving
from specguard.store.baseline import parse_baseline
from tests.docs_pages import (
    MARKERS,
    REPO,
    Command,
    blocks,
    inline_commands,
    markers,
    names_problem,
    pages,
    prose,
    shell_commands,
    synopsis_commands,
)

# The blocks checked less than in full, by page and marker: a synopsis for its names only, a partial
# block (an excerpt that cannot stand alone) not at all.
MARKED = {
    ("commands.md", "synopsis"): 1,  # the synopsis of every command
    ("status.md", "synopsis"): 1,  # `specguard status` with its options in brackets
    ("fleet.md", "synopsis"): 1,  # `specguard fleet status` with its options in brackets
    ("slack.md", "partial"): 1,  # the rule that names the action, its other keys left out
    ("vllm-restart.md", "partial"): 1,  # the same
    ("sources.md", "partial"): 1,  # an excerpt of /api/status
    ("rule-examples.md", "partial"): 2,
    (
        "backtest.md",
        "partial",
    ): 1,  # an incidents file, not a config  # an example's timeline.yaml and expected.yaml, not configs
}
# The top-level keys of another program's config (Prometheus, Alertmanager): such a YAML block is
# counted below, and left to that program's own tools.
FOREIGN_KEYS = {"scrape_configs", "rule_files", "alerting", "route", "receivers", "global", "groups"}
CONFIG_KEYS = set(Config.model_fields)
SERVING_KEYS = set(Serving.model_fields)

ALL_BLOCKS = [block for page in pages() for block in blocks(page)]
HEREDOCS = [(where, name, text) for block in ALL_BLOCKS for where, name, text in shell_commands(block)[1]]
YAML_EXAMPLES: list[tuple[str, str]] = [
    (block.where, block.text)
    for block in ALL_BLOCKS
    if block.lang in ("yaml", "yml") and block.marker != "partial"
] + [(f"{where} ({name})", text) for where, name, text in HEREDOCS if name.endswith((".yaml", ".yml"))]


def _kind(data: Any) -> str:
    if isinstance(data, list):
        return "rules"  # a rule file's `rules:` list, as an excerpt of one
    if isinstance(data, dict) and data and set(data) <= CONFIG_KEYS:
        return "specguard"
    if isinstance(data, dict) and data and set(data) <= FOREIGN_KEYS:
        return "foreign"
    if isinstance(data, dict) and {"target", "method"} <= set(data) <= SERVING_KEYS:
        return "serving"  # specguard serve-config's serving file
    return "unknown"


def the_docs_baseline() -> str:
    """The baseline file the docs show (docs/baseline.md), for the configs that name one."""
    (found,) = [
        b.text for b in blocks(REPO / "docs" / "baseline.md") if b.lang == "json" and '"version": 2' in b.text
    ]
    return found


def _secrets(data: Any) -> list[tuple[str, str]]:
    """Each secret reference in ``data``: (credential | env | file, its name)."""
    out: list[tuple[str, str]] = []
    if isinstance(data, dict):
        if len(data) == 1 and next(iter(data)) in ("credential", "env", "file"):
            ((kind, name),) = data.items()
            return [(kind, str(name))]
        for value in data.values():
            out.extend(_secrets(value))
    elif isinstance(data, list):
        for value in data:
            out.extend(_secrets(value))
    return out


def check_example(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The errors `specguard check` finds in ``text``, written where a reader would put it: rules
    given as mappings go to a rule file of their own, the config beside it names the rest; the
    secrets it refers to exist, as the operator gives them."""
    data = yaml.safe_load(text)
    if isinstance(data, list):
        data = {"rules": data}
    rule_files: list[str] = []
    config_text = text
    rules = data.get("rules")
    if isinstance(rules, list) and any(isinstance(rule, dict) for rule in rules):
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"rules": rules}, sort_keys=False))
        rule_files = [str(tmp_path / "rules.yaml")]
        rest = {k: v for k, v in data.items() if k != "rules"}
        config_text = yaml.safe_dump(rest, sort_keys=False) if rest else ""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    for kind, name in _secrets(data):
        if kind == "credential":
            (credentials / name).write_text("a-secret\n")
        elif kind == "env":
            monkeypatch.setenv(name, "a-secret")
        elif not Path(name).is_absolute():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("a-secret\n")
    if isinstance(data.get("baseline"), str):
        (tmp_path / data["baseline"]).write_text(the_docs_baseline())
    config = tmp_path / "specguard.yaml"
    config.write_text(config_text)
    monkeypatch.chdir(tmp_path)
    loaded = load(config, rule_files)
    return [str(problem) for problem in loaded.errors]


def test_every_marker_stands_before_a_fence_and_the_marked_blocks_are_counted() -> None:
    for page in pages():
        kinds = [kind for _, kind in markers(page)]
        assert set(kinds) <= set(MARKERS), f"{page.name}: unknown docs-check marker in {kinds}"
        marked = [block.marker for block in blocks(page) if block.marker]
        assert sorted(marked) == sorted(kinds), (
            f"{page.name}: a docs-check marker is not on the line before a fence"
        )
    counted = Counter((block.page.name, block.marker) for block in ALL_BLOCKS if block.marker)
    assert dict(counted) == {key: n for key, n in MARKED.items() if n}


def test_the_pages_have_examples_to_check() -> None:
    # The reader finds the blocks: a change to how pages are read that loses them fails here.
    assert len(YAML_EXAMPLES) >= 10
    assert sum(len(shell_commands(b)[0]) for b in ALL_BLOCKS if b.marker is None) >= 30
    assert sum(len(inline_commands(page)) for page in pages()) >= 20


def test_every_yaml_example_is_a_specguard_config_a_rule_list_or_another_programs() -> None:
    kinds = Counter(_kind(yaml.safe_load(text)) for _, text in YAML_EXAMPLES)
    unknown = [where for where, text in YAML_EXAMPLES if _kind(yaml.safe_load(text)) == "unknown"]
    assert unknown == [], f"YAML examples that are neither (mark an excerpt partial): {unknown}"
    # Prometheus's scrape and rule files, Alertmanager's route: checked by their own tools, not here.
    assert kinds["foreign"] == 3, kinds


def test_each_serving_file_example_loads() -> None:
    servings = [(w, t) for w, t in YAML_EXAMPLES if _kind(yaml.safe_load(t)) == "serving"]
    assert servings, "docs/serve-config.md shows a serving file"
    for where, text in servings:
        load_serving(Path(where), text)  # raises with file:line: key: message


@pytest.mark.parametrize(
    ("where", "text"),
    [(w, t) for w, t in YAML_EXAMPLES if _kind(yaml.safe_load(t)) in ("specguard", "rules")],
    ids=[w for w, t in YAML_EXAMPLES if _kind(yaml.safe_load(t)) in ("specguard", "rules")],
)
def test_each_config_and_rule_example_passes_check(
    where: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert check_example(text, tmp_path, monkeypatch) == [], where


def test_the_check_of_an_example_finds_a_mistake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same path as the examples, on an example with a typo in a signal's name.
    (text,) = [t for w, t in YAML_EXAMPLES if w.startswith("docs/rules.md")]
    wrong = text.replace("signal: acceptance_rate", "signal: acceptance_rat")
    errors = check_example(wrong, tmp_path, monkeypatch)
    assert any("unknown signal 'acceptance_rat'" in e for e in errors), errors


def test_the_baseline_examples_are_valid_baselines() -> None:
    shown = [b for b in ALL_BLOCKS if b.lang == "json" and b.marker != "partial"]
    assert shown, "no baseline example found"
    for block in shown:
        parse_baseline(json.loads(block.text))


def _simulator_parser() -> argparse.ArgumentParser:
    from specguard.sim import cli as sim_cli

    parser = argparse.ArgumentParser(prog="specguard simulate")
    sim_cli.add_arguments(parser)
    return parser


def _parse(command: Command) -> str | None:
    """Why specguard's own parser refuses ``command``, or None."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if command.argv[:1] == ["simulate"]:
                from specguard.sim import cli as sim_cli

                sim_cli.parse_args(_simulator_parser(), command.argv[1:])
            else:
                build_parser().parse_args(command.argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


FULL_COMMANDS = [c for b in ALL_BLOCKS if b.marker is None for c in shell_commands(b)[0]]
SYNOPSES = [c for b in ALL_BLOCKS if b.marker == "synopsis" for c in synopsis_commands(b)]


@pytest.mark.parametrize("command", FULL_COMMANDS, ids=[f"{c.where} {c.text[:60]}" for c in FULL_COMMANDS])
def test_each_command_in_the_examples_parses(command: Command) -> None:
    problem = names_problem(command.argv, build_parser(), _simulator_parser()) or _parse(command)
    assert problem is None, f"{command.where}: `{command.text}`: {problem}"


def test_the_synopses_and_the_commands_in_the_prose_name_what_exists() -> None:
    parser, simulator = build_parser(), _simulator_parser()
    wrong = []
    for command in SYNOPSES:
        problem = names_problem(command.argv, parser, simulator)
        if problem:
            wrong.append(f"{command.where}: `{command.text}`: {problem}")
    for page in pages():
        for text in inline_commands(page):
            argv = text.split()[1:]
            problem = names_problem(argv, parser, simulator)
            if problem:
                wrong.append(f"{page.relative_to(REPO)}: `{text}`: {problem}")
    assert wrong == []


def test_a_command_with_a_flag_that_does_not_exist_is_caught() -> None:
    parser, simulator = build_parser(), _simulator_parser()
    assert names_problem(["eval", "--no-such-flag"], parser, simulator) == (
        "`specguard eval` has no option --no-such-flag"
    )
    assert names_problem(["eval", "--rul", "x"], parser, simulator) is not None  # argparse would take it
    assert names_problem(["ladder", "up|sideways"], parser, simulator) is not None
    assert names_problem(["no-such-command"], parser, simulator) is not None
    assert names_problem(["simulate", "--no-such-flag"], parser, simulator) is not None
    assert names_problem(["simulate", "--speculative-config.method", "ngram"], parser, simulator) is None
    made_up = Command("here", "specguard history --limit many", ["history", "--limit", "many"])
    assert _parse(made_up) is not None


def test_the_readme_links_to_pages_and_headings_that_exist() -> None:
    text = prose(REPO / "README.md")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "the README links to no page"
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", prose(target), flags=re.M)
            slugs = {_github_slug(h) for h in headings}
            assert anchor in slugs, f"{link}: no such heading in {path}"


def _github_slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_make_targets_the_pages_name_exist() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    named = {
        (page.relative_to(REPO), t)
        for page in pages()
        for t in re.findall(r"`make ([a-z][\w-]*)", prose(page))
    }
    named |= {
        (block.page.relative_to(REPO), t)
        for block in ALL_BLOCKS
        if block.lang == "sh"
        for t in re.findall(r"^make ([a-z][\w-]*)", block.text, flags=re.M)
    }
    assert {target for _, target in named} >= {"demo", "test", "docs"}
    assert [(str(page), target) for page, target in named if target not in targets] == []
