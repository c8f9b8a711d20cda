"""The example units in systemd/, the drop-in for vllm.service, and the polkit rule beside them.

`systemd-analyze verify` loads a unit the way systemd would and reports what systemd would warn about or
refuse: unknown keys, bad values, a Type= that does not fit the ExecStart= lines, a command that is not
there. The units name programs at their install paths (/opt/...), so each is checked in a copy whose
commands are replaced by programs that exist here; every command a unit runs must have a stand-in
(STAND_INS), so no unit goes unchecked because this test did not know what it runs.

vllm.service hands the speculative config to vLLM from the environment file specguard writes. Whether
the JSON arrives intact is decided by systemd's own parsing of ExecStart= and of the file, so that test
runs systemd's parsing code itself (the library systemd-analyze is built on) and then the command.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from specguard.actions.vllm_restart.speculative import render_env
from tests.installed import Installed
from tests.real import missing, require_binary

REPO = Path(__file__).resolve().parents[3]
SYSTEMD = REPO / "systemd"
UNITS = sorted(SYSTEMD.rglob("*.service"))
VLLM_UNIT = SYSTEMD / "vllm.service"
DROP_IN = SYSTEMD / "vllm.service.d" / "specguard.conf"
RULE = SYSTEMD / "polkit" / "50-specguard-vllm.rules"

VLLM_PYTHON = "/opt/vllm/venv/bin/python"
SPECGUARD = "/opt/specguard/venv/bin/specguard"
# Every program the units run, by the path they name, and what runs in its place here.
STAND_INS = {
    SPECGUARD: sys.executable,
    VLLM_PYTHON: sys.executable,
    "/bin/kill": "/bin/kill",
    "/bin/sh": "/bin/sh",
}
EXEC_LINE = re.compile(
    r"^(?P<key>Exec(?:Start|StartPre|StartPost|Condition|Reload|Stop|StopPost))="
    r"(?P<prefix>[-@:+!]*)(?P<program>\S*)",
    re.MULTILINE,
)


class UnknownProgram(Exception):
    """A unit runs a program that has no stand-in in STAND_INS."""


def stand_in(text: str, name: str, stand_ins: Mapping[str, str] = STAND_INS) -> tuple[str, list[str]]:
    """``text`` with every command's program replaced by its stand-in, and the programs replaced.

    An empty ``ExecStart=`` (the reset a drop-in starts with) runs nothing and is kept as it is.
    """
    replaced: list[str] = []

    def replace(match: re.Match[str]) -> str:
        program = match["program"]
        if not program:
            return match[0]
        if program not in stand_ins:
            raise UnknownProgram(
                f"{name}: {match['key']}= runs {program}, which has no stand-in in STAND_INS"
            )
        replaced.append(program)
        return f"{match['key']}={match['prefix']}{stand_ins[program]}"

    return EXEC_LINE.sub(replace, text), replaced


def copy_with_stand_ins(source: Path, target: Path, stand_ins: Mapping[str, str] = STAND_INS) -> list[str]:
    target.parent.mkdir(parents=True, exist_ok=True)
    text, replaced = stand_in(source.read_text(), source.name, stand_ins)
    target.write_text(text)
    return replaced


def verify(unit: Path) -> list[str]:
    """What `systemd-analyze verify` says about ``unit``: every line it prints, and its exit status
    when not 0. An empty list is a clean unit.

    No line is filtered out: on Debian 12 verify prints nothing at all for a clean unit, so any line,
    even one about another unit, is worth reading rather than hiding. An unknown key is only a warning
    (exit status 0), which is why the output counts and not just the exit status.
    """
    binary = require_binary("systemd-analyze", "systemd")
    result = subprocess.run(
        [binary, "verify", "--man=no", unit.name],
        cwd=unit.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    if result.returncode != 0:
        problems.append(f"systemd-analyze verify exited with status {result.returncode}")
    return problems


# --- systemd-analyze verify --------------------------------------------------------------------


def test_the_units_are_all_found() -> None:
    assert {unit.name for unit in UNITS} >= {"specguard.service", "vllm.service"}, UNITS


def installed_stand_ins(installed: Installed) -> dict[str, str]:
    """The stand-ins, with specguard's ExecStart pointing at the `specguard` a wheel installed."""
    return {**STAND_INS, SPECGUARD: str(installed.specguard)}


@pytest.mark.real
@pytest.mark.parametrize("unit", UNITS, ids=[str(unit.relative_to(SYSTEMD)) for unit in UNITS])
def test_unit_verifies_clean(tmp_path: Path, unit: Path, installed: Installed) -> None:
    replaced = copy_with_stand_ins(unit, tmp_path / unit.name, installed_stand_ins(installed))
    assert replaced, f"{unit.name} runs no command that this test replaced"
    assert verify(tmp_path / unit.name) == []


EXPOSURE = re.compile(r"Overall exposure level for specguard\.service: (\d+\.\d+) ")
# Where the operator guide (docs/install.md) shows the figure: the command's output, and the prose
# (which may wrap anywhere).
GUIDE = REPO / "docs" / "install.md"
GUIDE_EXPOSURE = re.compile(
    r"Overall exposure level:\s+(\d+\.\d+)|exposure score,\s+(\d+\.\d+)\s+on\s+a\s+scale"
)


def guide_exposure_figures() -> list[str]:
    text = GUIDE.read_text()
    return [a or b for a, b in GUIDE_EXPOSURE.findall(text)]


@pytest.mark.real
def test_the_service_exposure_is_at_most_2_0_and_is_the_figure_the_guide_shows(
    tmp_path: Path, installed: Installed
) -> None:
    """`systemd-analyze security --offline` scores the unit's sandboxing from 0 (locked down) to 10;
    the operator guide shows the figure, which must be the one measured here (a hardening change
    that moves it must move the guide too)."""
    binary = require_binary("systemd-analyze", "systemd")
    unit = tmp_path / "specguard.service"
    copy_with_stand_ins(SYSTEMD / "specguard.service", unit, installed_stand_ins(installed))
    result = subprocess.run(
        [binary, "security", "--offline=yes", "--no-pager", unit.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    found = EXPOSURE.search(result.stdout)
    assert found is not None, result.stdout[-2000:] + result.stderr
    assert float(found[1]) <= 2.0, result.stdout
    shown = guide_exposure_figures()
    assert len(shown) >= 2, f"{GUIDE.name} no longer shows the exposure figure where this test looks"
    assert set(shown) == {found[1]}, f"{GUIDE.name} shows {shown}; systemd-analyze measures {found[1]}"
    # Each hardening line the unit relies on is scored as present (a check mark), not only summed.
    for directive in ("ProtectSystem=", "PrivateDevices=", "NoNewPrivileges=", "RestrictNamespaces=~"):
        line = next(line for line in result.stdout.splitlines() if directive in line)
        assert line.lstrip().startswith("✓"), line


@pytest.mark.real
def test_vllm_unit_with_the_yaml_drop_in_verifies_clean(tmp_path: Path) -> None:
    copy_with_stand_ins(VLLM_UNIT, tmp_path / "vllm.service")
    replaced = copy_with_stand_ins(DROP_IN, tmp_path / "vllm.service.d" / DROP_IN.name)
    assert replaced == [VLLM_PYTHON]
    assert verify(tmp_path / "vllm.service") == []


BROKEN_UNITS = {
    # (unit, drop-in text or None, change to the unit's text, what verify must say)
    "unknown key": (
        "specguard.service",
        None,
        lambda text: text.replace("[Service]\n", "[Service]\nFrobnicate=yes\n"),
        "Unknown key 'Frobnicate'",
    ),
    "missing program": (
        "vllm.service",
        None,
        lambda text: text.replace("ExecStart=/bin/sh", "ExecStart=/nonexistent/bin/sh"),
        "/nonexistent/bin/sh is not executable",
    ),
    "drop-in without the ExecStart= reset": (
        "vllm.service",
        DROP_IN.read_text().replace("ExecStart=\n", ""),
        lambda text: text,
        "more than one ExecStart=",
    ),
    "unknown key in the drop-in": (
        "vllm.service",
        DROP_IN.read_text() + "Frobnicate=yes\n",
        lambda text: text,
        "Unknown key 'Frobnicate'",
    ),
}


@pytest.mark.real
@pytest.mark.parametrize("case", BROKEN_UNITS, ids=list(BROKEN_UNITS))
def test_verify_reports_a_broken_unit(tmp_path: Path, case: str) -> None:
    """The checks above are not vacuous: the same copies, broken on purpose, are reported."""
    name, drop_in, change, message = BROKEN_UNITS[case]
    text, _ = stand_in((SYSTEMD / name).read_text(), name)
    broken = change(text)
    assert broken != text or drop_in is not None, "the change did not apply: the unit's text moved"
    (tmp_path / name).write_text(broken)
    if drop_in is not None:
        (tmp_path / f"{name}.d").mkdir()
        (tmp_path / f"{name}.d" / "specguard.conf").write_text(stand_in(drop_in, "specguard.conf")[0])
    problems = verify(tmp_path / name)
    assert any(message in line for line in problems), problems


def test_a_program_without_a_stand_in_fails_the_check() -> None:
    with pytest.raises(UnknownProgram, match="/usr/local/bin/other"):
        stand_in("[Service]\nExecStart=\nExecStartPre=-/usr/local/bin/other --flag\n", "x.service")


# --- the speculative config, from specguard's environment file to vLLM's arguments ---------------


def speculative_env(config: dict[str, Any] | None) -> str:
    """The environment file as specguard's vllm_restart action writes it."""
    return render_env(config, "k as the test sets it")


class SystemdParsing:
    """systemd's own parsing of ExecStart= and EnvironmentFile=, from libsystemd-shared, the library
    systemctl and systemd-analyze are built on. Its functions are systemd's internals: their
    signatures and flag values change between releases, so this is bound to systemd 252, Debian 12's.
    """

    VERSION = 252
    EXTRACT_CUNESCAPE = 1 << 1  # systemd 252's ExtractFlags
    EXTRACT_UNQUOTE = 1 << 5

    def __init__(self) -> None:
        analyze = require_binary("systemd-analyze", "systemd")
        version = subprocess.run([analyze, "--version"], capture_output=True, text=True, check=True).stdout
        found = re.match(r"systemd (\d+)", version)
        if found is None or int(found[1]) != self.VERSION:
            missing(  # CI's Debian 12 has 252: there this fails rather than skips
                f"systemd's parsing is called through systemd {self.VERSION}'s library; this is {version[:40]!r}"
            )
        linked = subprocess.run(["ldd", analyze], capture_output=True, text=True, check=True).stdout
        library = re.search(rf"libsystemd-shared-{self.VERSION}\.so => (\S+)", linked)
        assert library is not None, linked
        self.lib = ctypes.CDLL(library[1])
        strv = ctypes.POINTER(ctypes.c_char_p)
        self.lib.extract_first_word.argtypes = [
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        self.lib.extract_first_word.restype = ctypes.c_int
        self.lib.load_env_file.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(strv)]
        self.lib.load_env_file.restype = ctypes.c_int
        self.lib.replace_env_argv.argtypes = [strv, strv]
        self.lib.replace_env_argv.restype = strv

    @staticmethod
    def _strv(items: list[str]) -> Any:
        array = (ctypes.c_char_p * (len(items) + 1))(*[item.encode() for item in items], None)
        return ctypes.cast(array, ctypes.POINTER(ctypes.c_char_p))

    @staticmethod
    def _list(strv: Any) -> list[str]:
        items: list[str] = []
        while strv[len(items)] is not None:
            items.append(strv[len(items)].decode())
        return items

    def exec_words(self, command: str) -> list[str]:
        """ExecStart='s value split into words, as systemd 252's config_parse_exec() splits it."""
        buffer = ctypes.create_string_buffer(command.encode())
        cursor = ctypes.cast(buffer, ctypes.c_char_p)
        words: list[str] = []
        while True:
            word = ctypes.c_char_p()
            found = self.lib.extract_first_word(
                ctypes.byref(cursor), ctypes.byref(word), None, self.EXTRACT_UNQUOTE | self.EXTRACT_CUNESCAPE
            )
            assert found >= 0, f"systemd cannot parse {command!r}: error {found}"
            if found == 0:
                return words
            assert word.value is not None
            words.append(word.value.decode())

    def load_env_file(self, path: Path) -> list[str]:
        """The NAME=value assignments systemd takes from an EnvironmentFile=."""
        env = ctypes.POINTER(ctypes.c_char_p)()
        result = self.lib.load_env_file(None, str(path).encode(), ctypes.byref(env))
        assert result >= 0, f"systemd cannot read {path}: error {result}"
        return self._list(env)

    def command(self, words: list[str], env: list[str]) -> list[str]:
        """The command systemd starts: ``words`` with $NAME, ${NAME} and $$ expanded from ``env``."""
        return self._list(self.lib.replace_env_argv(self._strv(words), self._strv(env)))


def exec_start(unit_text: str) -> str:
    """The unit's one ExecStart= value, continuation lines joined as systemd joins them."""
    joined = re.sub(r"\\\n", " ", unit_text)
    values = [line.split("=", 1)[1] for line in joined.splitlines() if line.startswith("ExecStart=")]
    assert len(values) == 1, values
    assert "%" not in values[0], "a specifier would need systemd's expansion, which this test does not do"
    return values[0]


def vllm_arguments(tmp_path: Path, command: str, env_file: str | None) -> list[str]:
    """The arguments vLLM gets when systemd runs ``command`` with ``env_file`` (None: no file)."""
    systemd = SystemdParsing()
    env: list[str] = []
    if env_file is not None:
        (tmp_path / "speculative.env").write_text(env_file)
        env = systemd.load_env_file(tmp_path / "speculative.env")
    argv = systemd.command(systemd.exec_words(command), env)
    # vLLM's Python is replaced by a program that prints the arguments it was given.
    stub = tmp_path / "vllm-python"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    argv = [word.replace(VLLM_PYTHON, str(stub)) for word in argv]
    assert any(str(stub) in word for word in argv), argv
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")} | dict(a.split("=", 1) for a in env)
    ran = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    arguments: list[str] = json.loads(ran.stdout)
    assert arguments[:2] == ["-m", "vllm.entrypoints.openai.api_server"], arguments
    assert "" not in arguments, arguments
    return arguments


SPECULATIVE = {
    "method": "draft_model",
    "model": "/models/a draft's copy",  # written as \u0020 and \u0027 in the file
    "num_speculative_tokens": 3,
}


def speculative(arguments: list[str]) -> list[str]:
    return [argument for argument in arguments if argument.startswith("--speculative")]


@pytest.mark.real
def test_vllm_gets_the_speculative_config_intact(tmp_path: Path) -> None:
    command = exec_start(VLLM_UNIT.read_text())
    [argument] = speculative(vllm_arguments(tmp_path, command, speculative_env(SPECULATIVE)))
    flag, _, value = argument.partition("=")
    assert flag == "--speculative-config"
    assert f"VLLM_SPECULATIVE_CONFIG='{value}'" in speculative_env(SPECULATIVE)  # byte for byte
    assert json.loads(value) == SPECULATIVE


@pytest.mark.real
@pytest.mark.parametrize("env_file", [speculative_env(None), None], ids=["off", "no-file"])
def test_vllm_gets_no_speculative_argument_when_off(tmp_path: Path, env_file: str | None) -> None:
    command = exec_start(VLLM_UNIT.read_text())
    assert speculative(vllm_arguments(tmp_path, command, env_file)) == []


@pytest.mark.real
def test_an_unbraced_variable_in_exec_start_would_break_the_json(tmp_path: Path) -> None:
    """Why vllm.service goes through /bin/sh, and proof that the checks above can fail: systemd
    splitting an unbraced $VAR itself strips the JSON's quotes and backslashes."""
    command = f"{VLLM_PYTHON} -m vllm.entrypoints.openai.api_server --model /models/target --speculative-config $VLLM_SPECULATIVE_CONFIG"
    arguments = vllm_arguments(tmp_path, command, speculative_env(SPECULATIVE))
    value = arguments[arguments.index("--speculative-config") + 1]
    assert value == "{method:draft_model,model:/models/au0020draftu0027su0020copy,num_speculative_tokens:3}"
    with pytest.raises(json.JSONDecodeError):
        json.loads(value)


# --- the polkit rule ------------------------------------------------------------------------------


def rule_code() -> str:
    """The rule without its comments."""
    return re.sub(r"//[^\n]*", "", RULE.read_text())


def test_polkit_rule_names_only_vllm_and_three_verbs() -> None:
    code = rule_code()
    assert code.count("polkit.addRule(") == 1
    assert set(re.findall(r'"([^"]*)"', code)) == {
        "org.freedesktop.systemd1.manage-units",
        "specguard",
        "unit",
        "vllm.service",
        "verb",
        "start",
        "stop",
        "restart",
    }
    assert re.search(r'action\.id !== "org\.freedesktop\.systemd1\.manage-units"', code)
    assert re.search(r'subject\.user !== "specguard"', code)
    assert re.search(r'action\.lookup\("unit"\) !== "vllm\.service"', code)
    allowed = re.search(r"var allowed = \[([^\]]*)\];", code)
    assert allowed is not None and json.loads(f"[{allowed[1]}]") == ["start", "stop", "restart"]
    results = re.findall(r"polkit\.Result\.(\w+)", code)
    assert results.count("YES") == 1 and set(results) == {"YES", "NOT_HANDLED"}, results
    # Debian's polkitd runs rules with Duktape, an ECMAScript 5 engine.
    assert not re.search(r"\b(let|const|class)\b|=>|`", code)


POLKIT_HARNESS = """
const fs = require("fs"), vm = require("vm");
const rules = [];
const polkit = {
  Result: {NO: "no", YES: "yes", AUTH_SELF: "auth_self", AUTH_SELF_KEEP: "auth_self_keep",
           AUTH_ADMIN: "auth_admin", AUTH_ADMIN_KEEP: "auth_admin_keep", NOT_HANDLED: null},
  addRule: function (rule) { rules.push(rule); },
  log: function () {},
};
vm.runInNewContext(fs.readFileSync(process.argv[1], "utf8"), {polkit: polkit});
const answers = JSON.parse(fs.readFileSync(0, "utf8")).map(function (c) {
  const action = {id: c.id, lookup: function (key) { return c.details[key]; }};
  const subject = {user: c.user, isInGroup: function () { return false; }};
  for (const rule of rules) {
    const result = rule(action, subject);
    if (result !== undefined && result !== null) return result;
  }
  return null;
});
process.stdout.write(JSON.stringify(answers));
"""


@pytest.mark.real
def test_polkit_rule_allows_only_specguard_to_start_stop_restart_vllm() -> None:
    """The rule run against every combination of user, action, unit and verb, in a JavaScript
    engine: node (Debian's `nodejs`, which CI installs)."""
    node = require_binary("node", "nodejs")
    verbs = ["start", "stop", "restart", "reload", "try-restart", "reload-or-restart"]
    verbs += ["reload-or-try-restart", "kill", "reset-failed", "set-property", None]
    cases = [
        {"id": action, "user": user, "details": {"unit": unit, "verb": verb}}
        for action in ["org.freedesktop.systemd1.manage-units", "org.freedesktop.systemd1.manage-unit-files"]
        for user in ["specguard", "vllm", "root"]
        for unit in ["vllm.service", "specguard.service", "vllm-other.service", None]
        for verb in verbs
    ]
    ran = subprocess.run(
        [node, "-e", POLKIT_HARNESS, str(RULE)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    answers = json.loads(ran.stdout)
    allowed = [
        (c["user"], c["details"]["unit"], c["details"]["verb"])
        for c, answer in zip(cases, answers, strict=True)
        if answer is not None
    ]
    assert sorted(allowed) == sorted(
        ("specguard", "vllm.service", verb) for verb in ["start", "stop", "restart"]
    )
    assert {answer for answer in answers if answer is not None} == {"yes"}
