"""The status page: ``GET /`` shows what ``specguard status`` prints, as HTML rendered here, with
no outside asset (no script, no remote style or font: it works with no internet), refreshed every
few seconds and readable on a phone. Silences can be expired from it.

Expiring a silence changes what the daemon does, so it asks for what the API asks for: the
daemon's bearer token, typed by the operator into a form (``GET /silences/{id}``) and posted once;
the page never holds it. The form is guarded against cross-site requests three ways: it carries
a value only this daemon's pages hold (an HMAC of the silence's id under a secret drawn at start),
a post whose ``Origin`` or ``Sec-Fetch-Site`` names another site is refused, and a daemon without
a token (loopback only) takes the post only when it was addressed by a loopback name, so a page
that rebinds its own host name to 127.0.0.1 cannot use the form either. Every page forbids
scripts, framing and posting elsewhere in its Content-Security-Policy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from html import escape
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from specguard.common.addresses import is_loopback
from specguard.common.secrets import bearer_matches
from specguard.daemon.statustext import clock, match_text
from specguard.daemon.statusview import Condition, Section, Tone, View, build
from specguard.dispatch import silences

log = logging.getLogger("specguard.page")

REFRESH = 5  # seconds between the status page's reloads
MAX_TOKEN = 4096  # characters of a typed token; a longer one is no token

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:12px}
h1{font-size:1.3em;margin:.2em 0 .4em}
h2{font-size:1.05em;margin:1.4em 0 .4em}
a{color:#0b57d0}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;font-size:.92em}
th,td{text-align:left;padding:4px 10px 4px 0;vertical-align:top;white-space:nowrap}
th{font-weight:600;color:#444;border-bottom:1px solid #bbb;font-size:.85em}
tr.row td{border-top:1px solid #e3e3e3}
tr.notes td{white-space:normal;color:#555;font-size:.88em;padding-top:0}
.good{color:#0a6b2d}.warn{color:#8a5a00}.bad{color:#b00020;font-weight:600}.muted{color:#777}
.banner{padding:8px 12px;border-radius:6px;margin:10px 0;border:1px solid #ccc}
.banner.bad{background:#fde7ea;border-color:#f3b4be}.banner.good{background:#e6f4ea;border-color:#a8d5b5}
.banner.warn{background:#fff4d6;border-color:#ecd28b}
ul.problems{margin:.3em 0;padding-left:1.2em}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:.6em 0}
dt{color:#555}dd{margin:0;overflow-wrap:anywhere}
p.empty,p.note{color:#555;margin:.2em 0}
form{margin:1em 0}
label{display:block;margin:.6em 0 .2em;font-weight:600}
input[type=password]{font-size:16px;padding:8px;width:100%;max-width:26em;box-sizing:border-box}
button{font-size:16px;padding:8px 16px;margin-top:10px}
footer{margin-top:2em;color:#777;font-size:.85em}
@media (max-width:600px){main{padding:8px}body{font-size:14px}dl.facts{grid-template-columns:1fr}dt{margin-top:4px}
table,tbody,tr,td{display:block}thead{display:none}tr.row{border-top:1px solid #ccc;padding:6px 0 2px}
tr.row td{border:0;padding:1px 0;white-space:normal;overflow-wrap:anywhere}
tr.row td[data-label]::before{content:attr(data-label) ": ";color:#666;font-size:.85em}
tr.row td:first-child{font-weight:600}tr.row td:first-child::before{content:none}
tr.notes td{padding:0 0 6px}tr.notes td:first-child{display:none}}
"""
_STYLE_HASH = base64.b64encode(hashlib.sha256(_CSS.encode()).digest()).decode()
POLICY = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_CONDITION_TONE = {Condition.HEALTHY: Tone.GOOD, Condition.DEGRADED: Tone.WARN, Condition.UNHEALTHY: Tone.BAD}


def routes(
    overview: Callable[[], Awaitable[Mapping[str, Any]]],
    call: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]],
    token: Callable[[], str | None],
) -> list[web.RouteDef]:
    """``GET /``, ``GET /silences/{id}`` (the form that expires it) and ``POST
    /silences/{id}/expire``. ``overview``: the daemon's status document; ``call`` runs a function on
    the store's writer thread; ``token``: the bearer token writes need (None: none, loopback only)."""
    secret = secrets.token_bytes(32)

    def form_key(silence_id: int) -> str:
        return hmac.new(secret, f"expire silence {silence_id}".encode(), hashlib.sha256).hexdigest()

    async def index(request: web.Request) -> web.Response:
        view = build(await overview())
        done = request.query.get("expired", "")
        message = (f"Silence {done} expired.", Tone.GOOD) if done.isdecimal() and len(done) < 12 else None
        return _html(status_page(view, message))

    async def one(request: web.Request) -> web.Response:
        silence_id = _id(request)
        if silence_id is None:
            return _html(_problem_page("A silence's id is a number."), 404)
        found = await call(partial(silences.get, silence_id=silence_id))
        if found is None:
            return _html(_problem_page(f"There is no silence {silence_id}."), 404)
        return _html(silence_page(found, time.time(), form_key(silence_id), token() is not None))

    async def expire(request: web.Request) -> web.Response:
        silence_id = _id(request)
        if silence_id is None:
            return _html(_problem_page("A silence's id is a number."), 404)
        now = time.time()
        found = await call(partial(silences.get, silence_id=silence_id))
        if found is None:
            return _html(_problem_page(f"There is no silence {silence_id}."), 404)
        needed = token()

        def refused(status: int, reason: str) -> web.Response:
            log.warning("silence %d: expiry from the status page refused: %s", silence_id, reason)
            return _html(silence_page(found, now, form_key(silence_id), needed is not None, reason), status)

        if request.content_type != "application/x-www-form-urlencoded":
            return refused(415, "Refused: send the page's form (application/x-www-form-urlencoded).")
        elsewhere = _cross_site(request)
        if elsewhere is not None:
            return refused(403, f"Refused: {elsewhere}.")
        form = await request.post()
        key = form.get("csrf")
        if not isinstance(key, str) or not hmac.compare_digest(key.encode(), form_key(silence_id).encode()):
            return refused(403, "Refused: this form is not one this daemon served (it may have restarted): "
                                "load the page again.")  # fmt: skip
        if needed is None:
            if not _loopback_host(request.host):
                return refused(403, "Refused: without a token this daemon takes writes only when addressed "
                                    "by its loopback address (127.0.0.1, ::1 or localhost).")  # fmt: skip
        else:
            typed = form.get("token")
            if not isinstance(typed, str) or not typed.strip():
                return refused(401, "Refused: type the daemon's API token.")
            if len(typed) > MAX_TOKEN or not bearer_matches("Bearer " + typed.strip(), needed):
                return refused(401, "Refused: wrong token. It is the daemon's API token, the one "
                                    "Alertmanager sends (server.webhook_token).")  # fmt: skip
        silence, ended = await call(partial(silences.end, silence_id=silence_id, now=now))
        if silence is None:
            return _html(_problem_page(f"There is no silence {silence_id}."), 404)
        if not ended:
            return refused(409, f"Silence {silence_id} had already ended.")
        log.warning("silence %d expired from the status page (%s)", silence_id, request.remote)
        raise web.HTTPSeeOther(f"/?expired={silence_id}", headers=HEADERS)

    return [
        web.get("/", index),
        web.get("/silences/{id}", one),
        web.post("/silences/{id}/expire", expire),
    ]


def _id(request: web.Request) -> int | None:
    text = request.match_info["id"]
    return int(text) if text.isdecimal() and len(text) < 12 else None


def _cross_site(request: web.Request) -> str | None:
    """Why the post comes from another site's page, or None."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"the form was posted from another site ({fetch_site})"
    origin = request.headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin)
        if origin == "null" or parts.netloc.lower() != request.host.lower():
            return f"the form was posted from another origin ({origin})"
    return None


def _loopback_host(host: str) -> bool:
    return is_loopback(urlsplit(f"//{host}").hostname or "")


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8", headers=HEADERS)


# --- rendering ----------------------------------------------------------------------------------


def _document(title: str, body: str, refresh: bool) -> str:
    reload = f'<meta http-equiv="refresh" content="{REFRESH}; url=/">\n' if refresh else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'{reload}<link rel="icon" href="data:,">\n<title>{escape(title)}</title>\n<style>{_CSS}</style>\n'
        f"</head>\n<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


def _tone(tone: Tone) -> str:
    return f' class="{tone.value}"' if tone.value else ""


def status_page(view: View, message: tuple[str, Tone] | None = None) -> str:
    """The whole status as one HTML page."""
    tone = _CONDITION_TONE[view.condition]
    firing = f"{len(view.firing)} firing" if view.firing else "none firing"
    parts = [f"<h1><span{_tone(tone)}>&#9679;</span> specguard {escape(view.version)}: "
             f"<span{_tone(tone)}>{view.condition.value}</span>, "
             f"<span{_tone(Tone.BAD if view.firing else Tone.PLAIN)}>{firing}</span></h1>"]  # fmt: skip
    if message is not None:
        parts.append(f'<p class="banner {message[1].value}" role="status">{escape(message[0])}</p>')
    if view.problems:
        items = "".join(f"<li>{escape(p)}</li>" for p in view.problems)
        parts.append(f'<div class="banner {tone.value}"><ul class="problems">{items}</ul></div>')
    facts = "".join(f"<dt>{escape(k)}</dt><dd{_tone(c.tone)}>{escape(c.text)}</dd>" for k, c in view.facts)
    parts.append(f'<dl class="facts">{facts}</dl>')
    parts.extend(_section(section) for section in view.sections)
    parts.append(
        f"<footer>Shown at {time.strftime('%H:%M:%S', time.gmtime(view.now))} UTC, again every {REFRESH} s. "
        'The same as <code>specguard status</code>; as JSON: <a href="/api/status">/api/status</a>.</footer>'
    )
    title = f"specguard: {view.condition.value}, {firing}"
    return _document(title, "\n".join(parts), refresh=True)


def _section(section: Section) -> str:
    slug = section.title.split(" (")[0].lower().replace(" ", "-")
    out = [f'<section id="{escape(slug)}">', f"<h2>{escape(section.title)}</h2>"]
    if section.note:
        out.append(f'<p class="note">{escape(section.note)}</p>')
    if not section.rows:
        out.append(f'<p class="empty">{escape(section.empty)}</p>')
        out.append("</section>")
        return "\n".join(out)
    expiring = any(row.silence is not None for row in section.rows)
    width = len(section.header) + (1 if expiring else 0)
    head = "".join(f"<th>{escape(h)}</th>" for h in section.header) + ("<th></th>" if expiring else "")
    out.append(f'<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>')
    for row in section.rows:
        data = "".join(f' data-{escape(k)}="{escape(v)}"' for k, v in row.data)
        cells = "".join(
            f'<td{_tone(cell.tone)} data-label="{escape(label)}">{escape(cell.text)}</td>'
            for label, cell in zip(section.header, row.cells, strict=True)
        )
        if expiring:
            cells += (
                f'<td><a href="/silences/{row.silence}">expire&hellip;</a></td>'
                if row.silence
                else "<td></td>"
            )
        out.append(f'<tr class="row"{data}>{cells}</tr>')
        if row.notes:
            notes = "<br>".join(escape(note) for note in row.notes)
            out.append(f'<tr class="notes"><td></td><td colspan="{width - 1}">{notes}</td></tr>')
    out.append("</tbody></table></div>\n</section>")
    return "\n".join(out)


def silence_page(
    item: silences.Silence, now: float, form_key: str, token_needed: bool, problem: str | None = None
) -> str:
    """One silence, and the form that expires it (none once it has ended)."""
    ended = item.expired is not None or item.ends <= now
    state = (
        "expired"
        if item.expired is not None
        else "ended"
        if ended
        else "active"
        if item.starts <= now
        else "pending"
    )
    facts = [
        ("Rule", item.rule),
        ("Match", match_text(item.match)),
        ("State", state),
        ("Starts", clock(item.starts, now) + " UTC"),
        ("Ends", clock(item.expired if item.expired is not None else item.ends, now) + " UTC"),
        ("Author", item.author),
        ("Reason", item.reason),
    ]
    parts = [f"<h1>Silence {item.id}</h1>"]
    if problem is not None:
        parts.append(f'<p class="banner bad" role="alert">{escape(problem)}</p>')
    parts.append(
        '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{escape(v)}</dd>" for k, v in facts) + "</dl>"
    )
    if ended:
        parts.append("<p>It has ended: there is nothing to expire.</p>")
    else:
        field = (
            '<label for="token">The daemon\'s API token</label>\n'
            '<input type="password" id="token" name="token" autocomplete="off" required>\n'
            '<p class="note">The bearer token its API takes (<code>server.webhook_token</code>). It is sent '
            "with this form only; the page does not keep it.</p>\n"
            if token_needed
            else '<p class="note">This daemon takes writes without a token: it listens on loopback only.</p>\n'
        )
        parts.append(
            f'<form method="post" action="/silences/{item.id}/expire">\n'
            f'<input type="hidden" name="csrf" value="{escape(form_key)}">\n{field}'
            f'<button type="submit">Expire silence {item.id} now</button>\n</form>'
        )
    parts.append('<p><a href="/">Back to the status</a></p>')
    return _document(f"specguard: silence {item.id}", "\n".join(parts), refresh=False)


def _problem_page(text: str) -> str:
    body = f'<h1>specguard</h1>\n<p class="banner bad" role="alert">{escape(text)}</p>\n<p><a href="/">Back to the status</a></p>'
    return _document("specguard", body, refresh=False)
