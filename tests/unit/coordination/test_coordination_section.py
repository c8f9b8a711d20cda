"""The coordination: section's bad input, through the real config loader: each a problem naming
the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from specguard.config.loading import load
from specguard.coordination.config import CoordinationConfig


def problems(tmp_path: Path, section: str) -> tuple[Path, list[str]]:
    config = tmp_path / "specguard.yaml"
    config.write_text("coordination:\n" + section)
    return config, [str(p) for p in load(config).errors]


def test_a_good_section_loads_with_its_limits_as_hosts_or_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_REDIS_PASSWORD", "s3cret")
    config = tmp_path / "specguard.yaml"
    config.write_text(
        "coordination:\n"
        "  store: redis\n"
        "  url: redis://10.0.0.5:6379/2\n"
        "  password: {env: FLEET_REDIS_PASSWORD}\n"
        "  host: web-7\n"
        "  max_concurrent_restarts: 25%\n"
        "  max_in_fallback: 3\n"
        "  restarts_per_hour: 6\n"
        "  lease_ttl: 1m\n"
    )
    loaded = load(config)
    assert [str(p) for p in loaded.errors] == []
    section = loaded.config.coordination
    assert isinstance(section, CoordinationConfig)
    assert (section.max_concurrent_restarts, section.max_in_fallback) == (0.25, 3)
    assert (section.lease_ttl, section.restarts_per_hour, section.timeout) == (60.0, 6, 5.0)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "max_concurrent_restarts: 150%",
            "coordination.max_concurrent_restarts: '150%': a share is over 0% and at most 100%",
        ),
        (
            "max_concurrent_restarts: 0%",
            "coordination.max_concurrent_restarts: '0%': a share is over 0% and at most 100%",
        ),
        (
            "max_concurrent_restarts: 0",
            "coordination.max_concurrent_restarts: 0: a number of hosts is a whole number, at least 1 (or a share: 25%)",
        ),
        (
            "max_concurrent_restarts: 2.5",
            "coordination.max_concurrent_restarts: 2.5: a number of hosts is a whole number, at least 1 (or a share: 25%)",
        ),
        (
            "max_in_fallback: half",
            "coordination.max_in_fallback: 'half' is neither a number of hosts (2) nor a share of the fleet (25%)",
        ),
        (
            "restarts_per_hour: 0",
            "coordination.restarts_per_hour: Input should be greater than or equal to 1",
        ),
        ("lease_ttl: 1s", "coordination.lease_ttl: Input should be greater than or equal to 2"),
        ("timeout: 0", "coordination.timeout: Input should be greater than 0"),
        (
            "prefix: 'a b/'",
            "coordination.prefix: a prefix is a non-empty key prefix without spaces, like specguard/",
        ),
        ("host: 'web:1'", "coordination.host: a host name is 1-200 characters, without spaces or ':'"),
        (
            "password: {file: a, env: B}",
            "coordination.password: give exactly one of `file`, `credential` or `env`",
        ),
        ("colour: blue", "coordination.colour: unknown key"),
    ],
)
def test_a_bad_field_is_named_with_its_line(tmp_path: Path, line: str, message: str) -> None:
    config, found = problems(tmp_path, f"  store: redis\n  url: redis://127.0.0.1:6379/0\n  {line}\n")
    assert found == [f"{config}:4: {message}"]


def test_an_unknown_store_is_named(tmp_path: Path) -> None:
    config, found = problems(tmp_path, "  store: zookeeper\n  url: http://127.0.0.1:2181\n")
    assert found == [f"{config}:2: coordination.store: Input should be 'etcd' or 'redis'"]


@pytest.mark.parametrize(
    ("store", "url", "message"),
    [
        (
            "etcd",
            "redis://127.0.0.1:6379/0",
            "'redis://127.0.0.1:6379/0' is not an etcd URL like http://127.0.0.1:2379",
        ),
        (
            "redis",
            "http://127.0.0.1:2379",
            "'http://127.0.0.1:2379' is not a redis URL like redis://127.0.0.1:6379/0",
        ),
        ("redis", "redis:///0", "'redis:///0' is not a redis URL like redis://127.0.0.1:6379/0"),
        (
            "redis",
            "redis://:hunter2@127.0.0.1:6379/0",
            "no password in the URL; give `password: {file: ...}` or {env: ...}",
        ),
        (
            "etcd",
            "redis://:hunter2@127.0.0.1:6379/0",  # the wrong scheme too: the password is still not said
            "no password in the URL; give `password: {file: ...}` or {env: ...}",
        ),
        (
            "etcd",
            "http://root:hunter2@127.0.0.1:2379",
            "no password in the URL; give `password: {file: ...}` or {env: ...}",
        ),
    ],
)
def test_a_url_that_does_not_fit_the_store_is_named(
    tmp_path: Path, store: str, url: str, message: str
) -> None:
    config, found = problems(tmp_path, f"  store: {store}\n  url: {url}\n")
    # The URL's own line and field; a password in it is never repeated, whatever else is wrong.
    assert found == [f"{config}:3: coordination.url: {message}"]
    assert "hunter2" not in found[0]


def test_a_password_that_cannot_be_read_is_named_at_its_line_and_never_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_REDIS_PASSWORD", raising=False)
    config, found = problems(
        tmp_path, "  store: redis\n  url: redis://10.0.0.5:6379/0\n  password: {env: FLEET_REDIS_PASSWORD}\n"
    )
    assert found == [f"{config}:4: coordination.password: the fleet store's password: environment variable "
                     "FLEET_REDIS_PASSWORD is not set"]  # fmt: skip
    config, found = problems(tmp_path, "  store: etcd\n  url: http://10.0.0.5:2379\n  user: specguard\n")
    assert found == [f"{config}:1: coordination: etcd's authentication needs both `user` and `password`"]
