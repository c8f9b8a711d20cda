"""deploy/specguard.example.yaml, which the operator guide (docs/install.md) starts a host from, passes
`specguard check`: as shipped, and with its commented actions turned on and the credentials they
name given the way the guide gives them (files named as the unit's LoadCredential= names them, in
$CREDENTIALS_DIRECTORY)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from tests.processes import specguard

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "deploy" / "specguard.example.yaml"
# The keys whose commented blocks are turned on: the actions, the webhook token, the router and the report's
# Slack thread. The other commented keys are alternatives to what is set (the Prometheus source
# instead of scraping, the flag API instead of the file) or need files of the operator's own.
TURNED_ON = ("webhook_token", "fallback", "oncall", "slack", "routing")
CREDENTIALS = {"webhook-token": "a-webhook-token", "slack-bot-token": "xoxb-example"}


def environment(credentials: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    if credentials is not None:
        env["CREDENTIALS_DIRECTORY"] = str(credentials)
    return env


def uncomment(text: str, key: str) -> str:
    """``text`` with the commented block ``# key:`` turned on: its first line and the lines below
    it that are commented at its depth or deeper lose one ``# ``. A nested alternative (``#   #
    http:``) stays a comment."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    found = 0
    i = 0
    while i < len(lines):
        header = re.match(rf"( *)# {re.escape(key)}:", lines[i])
        if header is None:
            out.append(lines[i])
            i += 1
            continue
        found += 1
        indent = header[1]
        out.append(indent + lines[i][len(indent) + 2 :])
        i += 1
        while i < len(lines) and lines[i].startswith(indent + "#   "):
            out.append(indent + lines[i][len(indent) + 2 :])
            i += 1
    assert found == 1, f"{EXAMPLE.name} has {found} commented blocks '# {key}:' (expected one)"
    return "".join(out)


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": warning: " in line]


def unused_actions(stderr: str) -> list[str]:
    """The actions `check` warns no rule names."""
    found = (
        re.search(r": warning: actions\.([\w-]+): no rule lists this action", line)
        for line in warnings(stderr)
    )
    return sorted(match.group(1) for match in found if match)


async def test_the_example_config_checks_as_shipped(tmp_path: Path) -> None:
    code, out, err = await specguard("check", "--config", str(EXAMPLE), cwd=tmp_path, env=environment(None))
    assert code == 0, out + err
    assert out.startswith("OK: 8 rules in 1 file(s), 2 action(s)"), out  # log-warn and the built-in log
    # What it leaves to the operator is the baseline, measured on the host with `specguard bench`,
    # and naming its actions in rules (the shipped pack's rules name only `log`).
    assert warnings(err), err
    assert unused_actions(err) == ["log-warn"], err
    assert all("baseline" in line for line in warnings(err) if "actions." not in line), err


async def test_the_example_with_its_actions_on_needs_and_takes_the_credentials(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    for key in TURNED_ON:
        text = uncomment(text, key)
    config = tmp_path / "specguard.yaml"
    config.write_text(text)

    # Without the credentials: refused, each named (the file refers to them; it holds no secret).
    code, out, err = await specguard("check", "--config", str(config), cwd=tmp_path, env=environment(None))
    assert code != 0
    for name in CREDENTIALS:
        assert f"credential '{name}' needs $CREDENTIALS_DIRECTORY" in out + err, out + err

    # As the operator guide's step 4 gives them: one file per secret, named as LoadCredential= names it.
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    for name, secret in CREDENTIALS.items():
        (credentials / name).write_text(secret + "\n")
    code, out, err = await specguard(
        "check", "--config", str(config), cwd=tmp_path, env=environment(credentials)
    )
    assert code == 0, out + err
    assert out.startswith("OK: 8 rules in 1 file(s), 4 action(s)"), out  # fallback and oncall too
    if shutil.which("nginx") is not None:  # the router, rendered and checked by nginx -t
        assert "routing: 3 class(es), nginx -t passed" in out, out
    else:
        assert "routing: nginx is not installed on this host" in out, out
    # oncall posts the weekly report (report.slack); the flag waits for a rule that names it
    assert unused_actions(err) == ["fallback", "log-warn"], err
    assert all("baseline" in line for line in warnings(err) if "actions." not in line), err
    for secret in CREDENTIALS.values():
        assert secret not in out + err
