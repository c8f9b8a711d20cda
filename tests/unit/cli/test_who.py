"""Who is at the keyboard, as `ladder`, `tune` and `silence add` record it."""

from __future__ import annotations

import getpass

import pytest

from specguard.cli.shared.options import who


def test_the_user_behind_sudo_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUDO_USER", "alice")
    monkeypatch.setenv("USER", "root")
    assert who() == "alice"


def test_else_the_user_running_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr(getpass, "getuser", lambda: "bob")
    assert who() == "bob"


def test_a_system_without_a_name_for_the_user_gives_a_question_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    def nameless() -> str:
        raise OSError("No username set in the environment")

    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr(getpass, "getuser", nameless)
    assert who() == "?"
