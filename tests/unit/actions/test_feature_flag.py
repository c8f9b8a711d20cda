"""The feature_flag action: its two backends against real files and a real HTTP server on
loopback, its holders kept in the real store, and its configuration's bad input."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from pydantic import ValidationError
from pytest_aiohttp import AiohttpServer

from specguard.actions.base import ActionContext
from specguard.actions.feature_flag import FeatureFlagAction, FeatureFlagParams
from specguard.actions.feature_flag.backends import (
    BackendError,
    FileBackend,
    FileParams,
    HttpBackend,
    HttpParams,
    render,
)
from specguard.store.database import Store
from specguard.store.memory import StoreMemory

TOKEN = "flag-api-token"


def context(store: Store, action: str, instance: str = "a", rule: str = "low") -> ActionContext:
    labels = {"instance": instance}
    return ActionContext(
        rule=rule,
        event="firing",
        severity="critical",
        labels=labels,
        value=0.2,
        threshold=0.5,
        summary="acceptance low",
        series=json.dumps(labels),
        memory=StoreMemory(store, action),
    )


class FlagApi:
    """A flag service on loopback: records every request; answers from a script of statuses."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any, float]] = []
        self.script: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, dict(request.headers), body, time.monotonic()))
        status = self.script.pop(0) if self.script else 200
        return web.json_response({"ok": status < 300}, status=status)


@pytest.fixture
async def api(aiohttp_server: AiohttpServer) -> tuple[FlagApi, str]:
    flags = FlagApi()
    app = web.Application()
    app.router.add_route("*", "/flags/{name}", flags.handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    return flags, f"http://127.0.0.1:{server.port}/flags/speculative"


def http_action(url: str, tmp_path: Path, **extra: Any) -> FeatureFlagAction:
    (tmp_path / "token").write_text(TOKEN + "\n")
    raw = {
        "type": "feature_flag",
        "http": {
            "url": url,
            "method": "PUT",
            "headers": {"X-Team": "ml-platform"},
            "engage": {"speculative": False},
            "restore": {"speculative": True},
            "retries": 2,
            "backoff": "50ms",
            "token": {"file": "token"},
            **extra,
        },
        "quiet_period": "0s",
    }
    params = FeatureFlagParams.model_validate(raw, context={"base": tmp_path})
    return FeatureFlagAction("fallback", params)


async def test_http_engage_sends_the_configured_request_with_the_token(
    api: tuple[FlagApi, str], tmp_path: Path, store: Store
) -> None:
    flags, url = api
    action = http_action(url, tmp_path)
    outcome = await action.run(context(store, "fallback"))
    assert outcome.ok, outcome.detail
    ((method, path, headers, body, _),) = flags.requests
    assert (method, path, body) == ("PUT", "/flags/speculative", {"speculative": False})
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["X-Team"] == "ml-platform"
    assert TOKEN not in outcome.detail
    assert (await store.memory_read("fallback", "flag"))["engaged"] is True


async def test_http_retries_5xx_with_doubling_waits_and_fails_at_once_on_a_4xx(
    api: tuple[FlagApi, str], tmp_path: Path
) -> None:
    flags, url = api
    backend = HttpBackend(HttpParams(url=url, retries=2, backoff=0.05), None)
    flags.script = [503, 502, 200]
    assert "after 2 retries" in await backend.set({"x": 1}, "engage")
    times = [at for *_, at in flags.requests]
    assert times[1] - times[0] >= 0.05 and times[2] - times[1] >= 0.1  # 50 ms, then 100 ms

    flags.requests.clear()
    flags.script = [400]
    with pytest.raises(BackendError, match=r"answered 400"):
        await backend.set({"x": 1}, "engage")
    assert len(flags.requests) == 1  # a wrong request is not sent again

    flags.requests.clear()
    flags.script = [503, 503, 503]
    with pytest.raises(BackendError, match=r"failed 3 times, last: 503"):
        await backend.set({"x": 1}, "restore")


async def test_http_connection_refused_is_retried_then_reported(unused_tcp_port: int) -> None:
    backend = HttpBackend(
        HttpParams(url=f"http://127.0.0.1:{unused_tcp_port}/f", retries=1, backoff=0.01), None
    )
    with pytest.raises(BackendError, match=r"failed 2 times, last: Client"):
        await backend.set({}, "engage")


def test_http_params_refuse_bad_input() -> None:
    with pytest.raises(ValidationError, match="http:// or https://"):
        HttpParams(url="router:8080/flags")
    with pytest.raises(ValidationError, match="token"):
        HttpParams(url="http://r/f", headers={"Authorization": "Bearer x"})
    with pytest.raises(ValidationError, match="one backend"):
        FeatureFlagParams.model_validate({"type": "feature_flag"})
    with pytest.raises(ValidationError, match="one backend"):
        FeatureFlagParams.model_validate(
            {
                "type": "feature_flag",
                "http": {"url": "http://r/f"},
                "file": {"path": "f.json", "engage": {}, "restore": {}},
            }
        )


def test_a_token_file_that_cannot_be_read_is_a_clear_error(tmp_path: Path) -> None:
    params = FeatureFlagParams.model_validate(
        {"type": "feature_flag", "http": {"url": "http://r/f", "token": {"file": "missing"}}},
        context={"base": tmp_path},
    )
    with pytest.raises(ValueError, match=r"actions.fallback.http.token .*missing: cannot read it"):
        FeatureFlagAction("fallback", params)


# --- file backend -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("flags.json", lambda text: json.loads(text) == {"speculative": False, "reason": "acceptance low"}),
        (
            "flags.yaml",
            lambda text: yaml.safe_load(text) == {"speculative": False, "reason": "acceptance low"},
        ),
        ("flags.env", lambda text: text == 'reason="acceptance low"\nspeculative=false\n'),
    ],
)
async def test_the_file_is_written_in_its_format_and_the_previous_version_kept(
    tmp_path: Path, name: str, check: Any
) -> None:
    path = tmp_path / name
    path.write_text("old\n")
    path.chmod(0o640)
    params = FileParams(
        path=path,
        engage={"reason": "acceptance low", "speculative": False},
        restore={"reason": "", "speculative": True},
    )
    done = await FileBackend(params).set(params.engage, "engage")
    assert done == f"wrote {path}"
    assert check(path.read_text())
    assert (tmp_path / f"{name}.prev").read_text() == "old\n"
    assert path.stat().st_mode & 0o777 == 0o640  # the reader's permissions are kept
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    # the same value again writes nothing
    assert await FileBackend(params).set(params.engage, "engage") == f"{path} already says so"


def test_env_values_are_quoted_so_a_shell_reads_them_back(tmp_path: Path) -> None:
    text = render("env", {"A": 'say "hi" $HOME', "B": "", "C": 3})
    path = tmp_path / "x.env"
    path.write_text(text)
    import subprocess

    out = subprocess.run(
        ["sh", "-c", f'. {path}; printf \'%s|%s|%s\' "$A" "$B" "$C"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == 'say "hi" $HOME||3'


async def test_the_reload_command_runs_without_a_shell_and_its_failure_is_reported(tmp_path: Path) -> None:
    marker = tmp_path / "reloaded"
    script = f"import pathlib, sys; pathlib.Path({str(marker)!r}).write_text(sys.argv[1])"
    params = FileParams(
        path=tmp_path / "flags.json",
        engage={"speculative": False},
        restore={"speculative": True},
        reload=(sys.executable, "-c", script, "$HOME;echo"),
    )
    done = await FileBackend(params).set(params.engage, "engage")
    assert done.endswith(f"ran {sys.executable} -c {script} $HOME;echo")
    assert marker.read_text() == "$HOME;echo"  # no shell: taken literally

    failing = params.model_copy(
        update={"reload": (sys.executable, "-c", "print('no router here'); raise SystemExit(3)")}
    )
    with pytest.raises(BackendError, match=r"exited with 3: no router here"):
        await FileBackend(failing).set(params.restore, "restore")
    slow = params.model_copy(
        update={"reload": (sys.executable, "-c", "import time; time.sleep(30)"), "reload_timeout": 0.2}
    )
    with pytest.raises(BackendError, match=r"did not finish within 0.2s; killed"):
        await FileBackend(slow).set(params.engage, "engage")
    missing = params.model_copy(update={"reload": ("/nonexistent/reload-router",)})
    with pytest.raises(BackendError, match=r"cannot run /nonexistent/reload-router"):
        await FileBackend(missing).set(params.restore, "restore")


def test_file_params_refuse_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="list of arguments"):
        FileParams(path=tmp_path / "f.json", engage={}, restore={}, reload="systemctl reload router")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="not a variable name"):
        FileParams(path=tmp_path / "f.env", engage={"bad-key": 1}, restore={})
    with pytest.raises(ValidationError, match="plain values"):
        FileParams(path=tmp_path / "f.env", engage={"A": [1]}, restore={})


async def test_an_unwritable_flag_file_fails_the_run_and_says_why(tmp_path: Path, store: Store) -> None:
    if os.geteuid() == 0:
        target = tmp_path / "no-such-dir" / "flags.json"  # root writes anywhere; a missing directory stops it
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "flags.json"
    params = FeatureFlagParams.model_validate(
        {"type": "feature_flag", "file": {"path": str(target), "engage": {"s": 0}, "restore": {"s": 1}}}
    )
    outcome = await FeatureFlagAction("fallback", params).run(context(store, "fallback"))
    assert not outcome.ok
    assert f"engage: cannot write {target}" in outcome.detail
    assert (await store.memory_read("fallback", "flag"))["engaged"] is False


# --- what is confirmed ------------------------------------------------------------------------


async def test_an_engage_is_unknown_until_confirmed_and_writing_it_again_changes_nothing(
    tmp_path: Path, store: Store
) -> None:
    path = tmp_path / "flags.json"
    params = FeatureFlagParams.model_validate(
        {
            "type": "feature_flag",
            "file": {"path": str(path), "engage": {"spec": False}, "restore": {"spec": True}},
        }
    )
    action = FeatureFlagAction("fallback", params)
    memory = StoreMemory(store, "fallback")
    seen: list[str] = []

    class Watching(FileBackend):
        async def set(self, value: Any, what: str) -> str:
            seen.append(
                (await store.memory_read("fallback", "flag"))["state"]
            )  # as a crash here would leave it
            return await super().set(value, what)

    action.backend = Watching(params.file)  # type: ignore[arg-type]
    assert (await action.engage(memory)).detail.startswith("fallback engaged: wrote")
    assert seen == ["unknown"]
    record = await store.memory_read("fallback", "flag")
    assert (record["state"], record["engaged"]) == ("engaged", True)
    assert await action.read_world() == "engaged"
    again = await action.engage(memory)  # a change repeated after a crash: the same file
    assert again.ok and "already says so" in again.detail
    assert len(record["spans"]) == 1 and len((await store.memory_read("fallback", "flag"))["spans"]) == 1

    done = await action.restore_flag(memory)
    assert done.ok and done.detail.startswith("speculative decoding restored after")
    assert json.loads(path.read_text()) == {"spec": True} and await action.read_world() == "restored"
    record = await store.memory_read("fallback", "flag")
    assert record["state"] == "restored" and record["spans"][0]["restored"] is not None
    path.write_text('{"spec": "someone else\'s"}')
    assert await action.read_world() is None  # neither value: not specguard's to interpret


async def test_failed_writes_back_off_doubling_and_a_low_canary_waits_longer(
    api: tuple[FlagApi, str], tmp_path: Path, store: Store
) -> None:
    flags, url = api
    action = http_action(url, tmp_path, retries=0)
    memory = StoreMemory(store, "fallback")
    flags.script = [503, 503]
    first = await action.engage(memory)
    assert not first.ok and first.retry_after == 10.0 and "not known to be engaged" in first.detail
    second = await action.engage(memory)
    assert second.retry_after == 20.0  # doubled
    assert (await store.memory_read("fallback", "flag"))["state"] == "unknown"
    assert (await action.engage(memory)).ok
    record = await store.memory_read("fallback", "flag")
    assert (record["state"], record["failures"]) == ("engaged", 0)
    flags.script = [500]
    failed = await action.restore_flag(memory)
    assert failed.retry_after == 10.0 and "may still be engaged" in failed.detail
    assert (await action.restore_flag(memory)).ok
    assert [body for _, _, _, body, _ in flags.requests] == [{"speculative": False}] * 3 + [
        {"speculative": True}
    ] * 2


async def test_the_flag_api_is_read_back_when_a_read_url_is_given(
    api: tuple[FlagApi, str], tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    answer: dict[str, Any] = {"speculative": False, "updated_by": "router"}

    async def get(request: web.Request) -> web.Response:
        return web.json_response(answer)

    app = web.Application()
    app.router.add_get("/flags/speculative", get)
    server = await aiohttp_server(app, host="127.0.0.1")
    _, url = api
    read_url = f"http://127.0.0.1:{server.port}/flags/speculative"
    assert await http_action(url, tmp_path).read_world() is None  # no read_url: never read back
    action = http_action(url, tmp_path, read_url=read_url)
    assert await action.read_world() == "engaged"  # the API may answer more fields than it was sent
    answer["speculative"] = True
    assert await action.read_world() == "restored"
    answer.clear()
    assert await action.read_world() is None


def test_a_timeout_that_cannot_hold_a_restore_is_refused_naming_both(tmp_path: Path) -> None:
    raw = {
        "type": "feature_flag",
        "timeout": "60s",
        "http": {"url": "http://127.0.0.1:9/f", "retries": 3, "request_timeout": "10s", "backoff": "1s"},
        "canary": {"url": "http://127.0.0.1:8000", "min_acceptance": 0.5, "timeout": "60s"},
    }
    with pytest.raises(ValidationError) as caught:
        FeatureFlagParams.model_validate(raw)
    message = str(caught.value)
    assert "timeout 1m cannot hold a restore, which may take 1m47s" in message
    assert "the canary's timeout 1m" in message and "the flag API's 4 tries of up to 10s" in message
    FeatureFlagParams.model_validate({**raw, "timeout": "107s"})  # what it says is enough is enough
    file_raw = {"type": "feature_flag", "timeout": "20s", "file": {"path": str(tmp_path / "f.json"), "engage": {"s": 0},
                "restore": {"s": 1}, "reload": ["true"], "reload_timeout": "30s"}}  # fmt: skip
    with pytest.raises(ValidationError, match="the reload command's timeout 30s"):
        FeatureFlagParams.model_validate(file_raw)


# --- what the flag API and the canary may answer ----------------------------------------------


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("1MiB", 1 << 20),
        ("512KiB", 512 << 10),
        ("2 MB", 2_000_000),
        (4096, 4096),
        ("4096", 4096),
        ("1GiB", 1 << 30),
    ],
)
def test_max_response_size_takes_a_size_with_a_unit_or_a_byte_count(given: Any, size: int) -> None:
    raw = {"type": "feature_flag", "http": {"url": "http://r/f"}}
    assert FeatureFlagParams.model_validate(raw).max_response_size == 1 << 20  # the default
    assert FeatureFlagParams.model_validate(raw).follow_redirects == "never"
    assert FeatureFlagParams.model_validate({**raw, "max_response_size": given}).max_response_size == size


@pytest.mark.parametrize(
    ("field", "given", "message"),
    [
        (
            "max_response_size",
            "1 megabyte",
            "invalid size '1 megabyte': give a number of bytes, or one with a unit",
        ),
        ("max_response_size", "0.5KiB", "a size of 512 bytes is outside 1 KiB to 1 GiB"),
        ("max_response_size", 12, "a size of 12 bytes is outside 1 KiB to 1 GiB"),
        ("max_response_size", "2GiB", "a size of 2,147,483,648 bytes is outside 1 KiB to 1 GiB"),
        ("max_response_size", -1, "a size of -1 bytes is outside"),
        ("max_response_size", True, "expected a size like 1MiB, 512KiB or a number of bytes, got True"),
        ("max_response_size", 1.5, "expected a size like 1MiB"),
        ("follow_redirects", "always", "'never' or 'same_origin'"),
    ],
)
def test_max_response_size_and_follow_redirects_refuse_bad_input(
    field: str, given: Any, message: str
) -> None:
    raw = {"type": "feature_flag", "http": {"url": "http://r/f"}, field: given}
    with pytest.raises(ValidationError, match=re.escape(message)):
        FeatureFlagParams.model_validate(raw)


def test_a_bad_max_response_size_is_a_config_problem_with_its_line(tmp_path: Path) -> None:
    from specguard.config.loading import load

    config = tmp_path / "specguard.yaml"
    config.write_text(
        "actions:\n"
        "  fallback:\n"
        "    type: feature_flag\n"
        "    http: {url: 'http://router:8080/flags/speculative'}\n"
        "    max_response_size: 1 megabyte\n"
        "    follow_redirects: same_host\n"
    )
    errors = [str(p) for p in load(config).errors]
    assert errors == [
        f"{config}:5: actions.fallback.max_response_size: invalid size '1 megabyte': give a number of bytes, "
        "or one with a unit (B, KB, MB, GB, KiB, MiB, GiB), e.g. 1MiB or 512KiB",
        f"{config}:6: actions.fallback.follow_redirects: Input should be 'never' or 'same_origin'",
    ]
