"""Mistakes on the command line that used to pass with exit 0: a rule name no rule has (`eval`,
`history`, `silence add`) and a source `eval` cannot read. Each is a message naming the mistake and
a non-zero exit; `silence add --force` adds a silence for an unknown rule, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specguard.engine.states import series_key
from specguard.store.database import Store
from specguard.store.records import SeriesState, State
from tests.processes import specguard

RULES = """\
rules:
  - {name: acceptance_low, signal: acceptance_rate, window: 1m, condition: "< 0.7"}
  - {name: memory_pressure, signal: kv_cache_usage, condition: "> 0.9"}
  - {name: acceptance_old, signal: acceptance_rate, condition: "< 0.1", enabled: false}
"""


def setup(tmp_path: Path) -> Path:
    (tmp_path / "rules.yaml").write_text(RULES)
    config = tmp_path / "specguard.yaml"
    config.write_text("state_dir: state\nrules: [rules.yaml]\n")
    return config


async def state_database(tmp_path: Path, recorded: str | None = None) -> None:
    """The state database a daemon leaves, with a series of ``recorded`` (a rule it ran) in it."""
    store = Store(tmp_path / "state" / "specguard.db")
    await store.open()
    if recorded is not None:
        labels = {"instance": "a"}
        await store.commit_evaluation(
            recorded, {series_key(labels): SeriesState(labels, State.INACTIVE)}, [], None
        )
    await store.close()


# --- eval -----------------------------------------------------------------------------------------


async def test_eval_refuses_a_rule_the_config_does_not_have_naming_the_close_ones(
    unused_tcp_port: int,
) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}/metrics"
    code, out, err = await specguard("eval", "--scrape", url, "--sample-gap", "0", "--rule", "acceptance_lo")
    assert (code, out) == (2, "")
    assert err == (
        "specguard eval: --rule acceptance_lo: no such rule in the default rules (no --config, no "
        "$SPECGUARD_CONFIG); did you mean acceptance_low or acceptance_fallback or acceptance_critical?\n"
    )


async def test_eval_refuses_an_unknown_or_disabled_rule_of_a_config_file(tmp_path: Path) -> None:
    config = setup(tmp_path)
    code, out, err = await specguard(
        "eval", "--config", str(config), "--rule", "acceptance_low", "--rule", "zzz"
    )
    assert (code, out) == (2, "")
    assert err == (
        f"specguard eval: --rule zzz: no such rule in {config}; known rules: acceptance_low, "
        "acceptance_old, memory_pressure\n"
    )
    code, out, err = await specguard("eval", "--config", str(config), "--rule", "acceptance_old")
    assert (code, out) == (2, "")
    assert err == (
        "specguard eval: --rule acceptance_old: the rule is disabled (enabled: false, "
        f"{tmp_path / 'rules.yaml'}:4): eval evaluates enabled rules\n"
    )


async def test_eval_exits_1_naming_each_target_it_could_not_read(
    vllm: str, unused_tcp_port: int, tmp_path: Path
) -> None:
    config = setup(tmp_path)
    down = f"http://127.0.0.1:{unused_tcp_port}/metrics"
    code, out, err = await specguard(
        "eval", "--config", str(config), "--scrape", vllm, "--scrape", down, "--sample-gap", "0.5",
        "--rule", "acceptance_low", "--format", "json",
    )  # fmt: skip
    assert code == 1, err
    (row,) = json.loads(out)  # what could be read is still shown: the target that answered
    assert (row["rule"], row["value"], row["state"]) == ("acceptance_low", pytest.approx(0.6), "firing")
    message = err[err.index("specguard eval: ") :].splitlines()
    assert message[0] == "specguard eval: could not read 1 of 2 targets (the rules saw no data from them):"
    assert message[1].startswith(f"  {down}: ")
    assert len(message) == 2 and vllm not in "\n".join(message)


async def test_eval_exits_1_when_prometheus_refuses_the_connection(
    unused_tcp_port: int, tmp_path: Path
) -> None:
    config = setup(tmp_path)
    url = f"http://127.0.0.1:{unused_tcp_port}"
    code, out, err = await specguard(
        "eval", "--config", str(config), "--prometheus", url, "--rule", "acceptance_low"
    )
    assert code == 1, err
    table = out.split("\n\n")[-1].splitlines()  # after the paragraph that says what eval is
    row = dict(zip(table[0].split(), table[1].split(), strict=False))
    assert (row["RULE"], row["SIGNAL"], row["VERDICT"]) == ("acceptance_low", "acceptance_rate", "error"), (
        table
    )
    assert err.endswith(
        "specguard eval: could not query the Prometheus source (the rules above could not be evaluated):\n"
        f"  prometheus {url}: connection refused\n"
    )


# --- history --------------------------------------------------------------------------------------


async def test_history_refuses_a_rule_neither_the_config_nor_the_database_has(tmp_path: Path) -> None:
    config = setup(tmp_path)
    await state_database(tmp_path, recorded="acceptance_gone")  # a rule the config has since lost
    code, out, err = await specguard("history", "--config", str(config), "--rule", "no_such_rule")
    assert (code, out) == (2, "")
    assert err.startswith(
        f"specguard history: --rule no_such_rule: no such rule in {config}, and the state database has "
        "recorded none by that name; known rules: acceptance_gone, acceptance_low, acceptance_old, memory_pressure"
    )
    code, _, err = await specguard("history", "--config", str(config), "--rule", "acceptance_lwo")
    assert code == 2
    assert err.rstrip().endswith("did you mean acceptance_low or acceptance_old or acceptance_gone?")
    # a rule of the config with no changes yet, and one only the database remembers: both fine
    for rule in ("memory_pressure", "acceptance_gone"):
        code, out, err = await specguard(
            "history", "--config", str(config), "--rule", rule, "--format", "json"
        )
        assert (code, out.strip(), err) == (0, "[]", ""), rule


# --- silence add ----------------------------------------------------------------------------------


async def test_silence_add_refuses_a_rule_no_rule_matches_unless_forced(tmp_path: Path) -> None:
    config = setup(tmp_path)
    await state_database(tmp_path)
    add = ("silence", "add", "--config", str(config), "--for", "1h", "--reason", "new draft")
    code, out, err = await specguard(*add, "--rule", "nonexistent_rule")
    assert (code, out) == (2, "")
    assert err == (
        f"specguard silence add: no rule in {config}, nor recorded in the state database, matches "
        "'nonexistent_rule'; known rules: acceptance_low, acceptance_old, memory_pressure\n"
        "(--force adds the silence all the same, for a rule about to be deployed)\n"
    )
    code, _, err = await specguard(*add, "--rule", "memory_*_typo")
    assert code == 2 and "matches 'memory_*_typo'" in err
    code, out, _ = await specguard("silence", "list", "--config", str(config), "--format", "json")
    assert (code, json.loads(out)) == (0, [])  # nothing was added

    code, out, err = await specguard(*add, "--rule", "nonexistent_rule", "--force")
    assert code == 0, err
    assert out.startswith("silence 1: rule nonexistent_rule, until ")
    assert err == (
        f"specguard silence add: warning: added with --force: no rule in {config}, nor recorded in the "
        "state database, matches 'nonexistent_rule'; it holds nothing back until such a rule runs\n"
    )
    code, out, err = await specguard(*add, "--rule", "acceptance_*")
    assert (code, err) == (0, "")
    assert out.startswith("silence 2: rule acceptance_*, until ")
    code, out, _ = await specguard("silence", "list", "--config", str(config), "--format", "json")
    assert [item["rule"] for item in json.loads(out)] == ["acceptance_*", "nonexistent_rule"]


async def test_silence_add_takes_a_rule_the_database_recorded_without_force(tmp_path: Path) -> None:
    # `--state-dir` alone reads the default rules: the daemon's own rules are known from what it recorded
    await state_database(tmp_path, recorded="my_team_rule")
    code, out, err = await specguard("silence", "add", "--state-dir", str(tmp_path / "state"), "--rule",
                                     "my_team_rule", "--for", "1h", "--reason", "maintenance")  # fmt: skip
    assert (code, err) == (0, "")
    assert out.startswith("silence 1: rule my_team_rule, until ")


async def test_silence_add_holds_to_the_configured_longest_silence_and_a_plain_author(tmp_path: Path) -> None:
    config = setup(tmp_path)
    await state_database(tmp_path)
    add = ("silence", "add", "--config", str(config), "--rule", "acceptance_low", "--reason", "new draft")
    code, out, err = await specguard(*add, "--for", "31d")
    assert (code, out) == (2, "")
    assert (
        err
        == "specguard silence add: for: 31d is longer than the longest silence, 30d (server.max_silence)\n"
    )
    config.write_text("state_dir: state\nrules: [rules.yaml]\nserver:\n  max_silence: 60d\n")
    code, out, err = await specguard(*add, "--for", "31d")
    assert (code, err) == (0, ""), err
    assert out.startswith("silence 1: rule acceptance_low, until ")
    code, out, err = await specguard(*add, "--for", "1h", "--author", "eve\x1b[2J")
    assert (code, out) == (2, "")
    assert err.startswith("specguard silence add: author: holds a control character (U+001B"), err
