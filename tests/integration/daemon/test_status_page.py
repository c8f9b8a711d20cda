"""The status page at the daemon's `/` over HTTP: the same as `specguard status`, self-contained,
and expiring a silence from it with the daemon's token: a wrong or missing token, a form from
another site or of another daemon, and a tokenless daemon addressed by another name are refused
with the reason on the page, and the silence stays."""

from __future__ import annotations

import html
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specguard.config.loading import load
from specguard.daemon.runtime import Daemon
from specguard.dispatch import silences
from tests.readings import Readings

TOKEN = "s3cret-token"
CONFIG = """\
server: {{port: 0{token}}}
state_dir: state
interval: 100ms
rules: [rules.yaml]
"""
RULES = """\
rules:
  - name: acceptance_low
    signal: acceptance_rate
    condition: "< 0.5"
    actions: [log]
"""


async def started(tmp_path: Path, token: bool) -> Daemon:
    (tmp_path / "specguard.yaml").write_text(
        CONFIG.format(token=", webhook_token_file: token" if token else "")
    )
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "token").write_text(TOKEN)
    loaded = load(tmp_path / "specguard.yaml")
    assert loaded.ok, loaded.problems
    daemon = Daemon(loaded, tmp_path / "specguard.yaml")
    daemon.source = Readings(0.2)
    await daemon.start(handle_signals=False)
    return daemon


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    running = await started(tmp_path, token=True)
    yield running
    await running.shutdown()


async def silence(daemon: Daemon, reason: str = "deploying a new draft") -> int:
    now = time.time()
    made = await daemon.store.call(
        lambda db: silences.add(db, "acceptance_*", {}, now, now + 3600, reason, "ops", now)
    )
    return int(made.id)


async def state_of(daemon: Daemon, silence_id: int) -> Any:
    return await daemon.store.call(lambda db: silences.get(db, silence_id))


async def get(daemon: Daemon, path: str) -> tuple[int, str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{daemon.port}{path}", allow_redirects=False) as answer,
    ):
        return answer.status, await answer.text(), answer.headers


async def post(
    daemon: Daemon, path: str, form: dict[str, str], headers: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{daemon.port}{path}", data=form, headers=headers or {}, allow_redirects=False
        ) as answer,
    ):
        return answer.status, await answer.text(), answer.headers


def form_key(page: str) -> str:
    (key,) = re.findall(r'<input type="hidden" name="csrf" value="([0-9a-f]+)">', page)
    return key


def banner(page: str) -> str:
    (text,) = re.findall(r'<p class="banner bad" role="alert">([^<]*)</p>', page)
    return html.unescape(text)


async def test_the_page_is_the_status_rendered_with_nothing_from_outside(daemon: Daemon) -> None:
    await silence(daemon, reason="<b>bold</b> & deploying")
    status, page, headers = await get(daemon, "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    policy = headers["Content-Security-Policy"]
    assert policy.startswith("default-src 'none'; style-src 'sha256-") and "frame-ancestors 'none'" in policy
    assert headers["X-Frame-Options"] == "DENY" and headers["Cache-Control"] == "no-store"
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert '<meta http-equiv="refresh" content="5; url=/">' in page
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)  # nothing to fetch
    assert re.search(r'<tr class="row" data-rule="acceptance_low" data-state="firing">', page)
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; deploying" in page and "<b>bold</b>" not in page
    assert '<a href="/silences/1">expire&hellip;</a>' in page
    assert TOKEN not in page


async def test_a_silence_is_expired_from_its_form_with_the_token(daemon: Daemon) -> None:
    silence_id = await silence(daemon)
    status, page, _ = await get(daemon, f"/silences/{silence_id}")
    assert status == 200 and TOKEN not in page
    assert '<input type="password" id="token" name="token" autocomplete="off" required>' in page
    key = form_key(page)

    status, page, _ = await post(daemon, f"/silences/{silence_id}/expire", {"csrf": key, "token": "guess"})
    assert status == 401
    assert banner(page).startswith("Refused: wrong token.")
    assert (await state_of(daemon, silence_id)).expired is None

    status, _, headers = await post(daemon, f"/silences/{silence_id}/expire", {"csrf": key, "token": TOKEN})
    assert (status, headers["Location"]) == (303, f"/?expired={silence_id}")
    assert (await state_of(daemon, silence_id)).expired is not None
    _, page, _ = await get(daemon, headers["Location"])
    assert f'<p class="banner good" role="status">Silence {silence_id} expired.</p>' in page
    assert "Silences (0)" in page

    status, page, _ = await post(daemon, f"/silences/{silence_id}/expire", {"csrf": key, "token": TOKEN})
    assert status == 409 and banner(page) == f"Silence {silence_id} had already ended."
    _, page, _ = await get(daemon, f"/silences/{silence_id}")
    assert "It has ended: there is nothing to expire." in page and "<form" not in page


@pytest.mark.parametrize(
    ("form", "headers", "status", "said"),
    [
        ({"token": TOKEN}, {}, 403, "Refused: this form is not one this daemon served"),
        ({"token": TOKEN, "csrf": "0" * 64}, {}, 403, "Refused: this form is not one this daemon served"),
        ({"csrf": "KEY"}, {}, 401, "Refused: type the daemon's API token."),
        ({"csrf": "KEY", "token": TOKEN}, {"Origin": "https://evil.example"}, 403,
         "Refused: the form was posted from another origin (https://evil.example)."),
        ({"csrf": "KEY", "token": TOKEN}, {"Sec-Fetch-Site": "cross-site"}, 403,
         "Refused: the form was posted from another site (cross-site)."),
        ({"csrf": "KEY", "token": TOKEN}, {"Content-Type": "text/plain"}, 415,
         "Refused: send the page's form (application/x-www-form-urlencoded)."),
    ],
    ids=["no-form-key", "wrong-form-key", "no-token", "other-origin", "cross-site", "not-a-form"],
)  # fmt: skip
async def test_an_expiry_that_cannot_be_trusted_is_refused_with_its_reason(
    daemon: Daemon, form: dict[str, str], headers: dict[str, str], status: int, said: str
) -> None:
    silence_id = await silence(daemon)
    _, page, _ = await get(daemon, f"/silences/{silence_id}")
    form = {k: form_key(page) if v == "KEY" else v for k, v in form.items()}
    body: Any = "&".join(f"{k}={v}" for k, v in form.items()) if "Content-Type" in headers else form
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{daemon.port}/silences/{silence_id}/expire", data=body,
                     headers=headers, allow_redirects=False) as answer,
    ):  # fmt: skip
        got, page = answer.status, await answer.text()
    assert got == status
    assert banner(page).startswith(said)
    assert (await state_of(daemon, silence_id)).expired is None


async def test_a_form_key_holds_for_its_own_silence_only(daemon: Daemon) -> None:
    first, second = await silence(daemon), await silence(daemon)
    _, page, _ = await get(daemon, f"/silences/{first}")
    status, page, _ = await post(
        daemon, f"/silences/{second}/expire", {"csrf": form_key(page), "token": TOKEN}
    )
    assert status == 403 and (await state_of(daemon, second)).expired is None


@pytest.mark.parametrize(("path", "said"), [("/silences/42", "There is no silence 42."),
                                            ("/silences/x1", "A silence's id is a number.")])  # fmt: skip
async def test_an_unknown_silence_is_404_with_a_page_that_says_so(
    daemon: Daemon, path: str, said: str
) -> None:
    status, page, _ = await get(daemon, path)
    assert status == 404 and banner(page) == said
    status, page, _ = await post(daemon, path + "/expire", {"csrf": "0", "token": TOKEN})
    assert status == 404 and banner(page) == said


async def test_without_a_token_only_a_loopback_address_may_expire(tmp_path: Path) -> None:
    daemon = await started(tmp_path, token=False)
    try:
        silence_id = await silence(daemon)
        _, page, _ = await get(daemon, f"/silences/{silence_id}")
        assert 'name="token"' not in page and "takes writes without a token" in page
        key = form_key(page)
        # a page whose own name now resolves to 127.0.0.1 (DNS rebinding) posts with its Host
        host = {"Host": f"status.evil.example:{daemon.port}"}
        status, page, _ = await post(daemon, f"/silences/{silence_id}/expire", {"csrf": key}, host)
        assert status == 403 and "only when addressed by its loopback address" in banner(page)
        assert (await state_of(daemon, silence_id)).expired is None
        status, _, _ = await post(daemon, f"/silences/{silence_id}/expire", {"csrf": key})
        assert status == 303 and (await state_of(daemon, silence_id)).expired is not None
    finally:
        await daemon.shutdown()
