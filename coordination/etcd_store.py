"""The fleet's semaphore on etcd, through etcd3gw (etcd's /v3/ JSON gateway, a blocking HTTP client
called from a small thread pool).

Keys, under the configured prefix (``specguard/``):

- ``sem/<name>/holders/<owner>``: one per slot held, bound to a lease of the slot's ttl. Renewing is
  a keep-alive of that lease; a holder that stops renewing loses its key when etcd ends the lease.
  Value: JSON ``{since, incident, ttl, expires}``.
- ``sem/<name>/guard``: rewritten by every grant. An acquire reads the whole ``sem/<name>/`` range,
  checks the holders and the budget, and commits in one transaction only if the guard's
  ``mod_revision`` is still the one it read: no other grant came in between (a conflict: read again,
  a bounded number of times). Slots freed meanwhile only make the check stricter than needed.
- ``sem/<name>/budget/<lease>``: one per grant counted against a budget, bound to a lease of the
  budget's window: etcd deletes it when the window has passed.
- ``hosts/<host>``: one per registered host, bound to a lease of the registration's ttl.

The fencing token is the revision of the granting transaction, which is the holder key's
``create_revision``: etcd's revision only grows, so tokens grow with every grant. ``holds`` checks
that the holder key still exists with that ``create_revision``. Time is etcd's own: leases run on
its clock, whatever ``clock`` says (``since`` and ``expires`` are written with the caller's).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception
from etcd3gw.lease import Lease

from specguard.coordination import reasons
from specguard.coordination.base import Budget, Coordinator, Grant, Holder, Unavailable

T = TypeVar("T")

ATTEMPTS = 8  # transactions tried before a contended acquire gives up (refused, not an error)
WORKERS = 4  # threads for the blocking HTTP calls of one Coordinator
# What a call may raise when etcd is down, slow or answers an error (ValueError, KeyError: an
# answer that is not the JSON expected).
FAILURES = (Etcd3Exception, requests.RequestException, OSError, ValueError, KeyError)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _seconds(ttl: float) -> int:
    """etcd leases last whole seconds: at least ``ttl``."""
    return max(1, math.ceil(ttl - 1e-9))


@dataclass(frozen=True)
class _Slot:
    owner: str
    token: int  # the holder key's create_revision
    lease: int
    value: dict[str, Any]

    def holder(self, expires: float | None = None) -> Holder:
        return Holder(
            owner=self.owner,
            token=self.token,
            since=float(self.value.get("since", 0.0)),
            expires=float(self.value.get("expires", 0.0)) if expires is None else expires,
            incident=str(self.value.get("incident", "")),
        )


@dataclass(frozen=True)
class _Seen:
    """One read of a semaphore's range: the guard's mod_revision, the holders, the budget keys."""

    guard: int
    slots: dict[str, _Slot]
    budget: int


class EtcdCoordinator(Coordinator):
    """A Coordinator on etcd. ``client``: an etcd3gw client whose timeout is the call timeout;
    ``where``: the server as messages name it; ``user``/``password``: etcd's authentication, when
    enabled; ``executor``: threads shared with other Coordinators (else its own, ``WORKERS``)."""

    name = "etcd"

    def __init__(
        self,
        client: Etcd3Client,
        where: str,
        prefix: str,
        timeout: float,
        clock: Callable[[], float] | None = None,
        user: str | None = None,
        password: str | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        super().__init__(prefix, timeout, clock)
        self._client = client
        self._where = where
        self._user, self._password = user, password
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(WORKERS, thread_name_prefix="etcd")

    # -- plumbing ---------------------------------------------------------------------------------

    def _now(self) -> float:
        return self.clock() if self.clock is not None else time.time()

    async def _run(self, what: str, work: Callable[[], T]) -> T:
        """``work`` on a thread, within the timeout; every failure is Unavailable."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._executor, work), self.timeout)
        except TimeoutError:
            raise Unavailable(f"etcd at {self._where}: {what}: no answer in {self.timeout:g}s") from None
        except FAILURES as exc:
            raise Unavailable(f"etcd at {self._where}: {what}: {_reason(exc)}") from exc

    def _do(self, call: Callable[[], T]) -> T:
        """One request, authenticated again once when etcd has forgotten the token (it expires)."""
        if self._user is not None and "Authorization" not in self._client.session.headers:
            self._authenticate()
        try:
            return call()
        except Etcd3Exception as exc:
            if self._user is None or "invalid auth token" not in (exc.detail_text or ""):
                raise
        self._authenticate()
        return call()

    def _authenticate(self) -> None:
        answer = self._client.post(
            self._client.get_url("/auth/authenticate"),
            json={"name": self._user, "password": self._password},
            headers={"Authorization": None},  # not the stale token: etcd refuses it here too
        )
        self._client.session.headers["Authorization"] = str(answer["token"])

    def _txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]]) -> dict[str, Any]:
        txn = {"compare": compare, "success": success, "failure": []}
        return dict(self._do(lambda: self._client.transaction(txn)))

    def _range(self, prefix: str, keys_only: bool = False) -> list[tuple[bytes, dict[str, Any]]]:
        start = prefix.encode()
        # etcd3gw sends a str range_end encoded as latin-1: this one is the UTF-8 bytes' successor.
        end = (start[:-1] + bytes([start[-1] + 1])).decode("latin-1")
        found = self._do(
            lambda: self._client.get(start, metadata=True, range_end=end, keys_only=keys_only or None)
        )
        return [(value, dict(meta)) for value, meta in found]

    def _grant_lease(self, ttl: float) -> int:
        return self._do(lambda: self._client.lease(_seconds(ttl))).id

    def _keepalive(self, lease: int) -> int:
        """The lease's TTL after a keep-alive; -1 when it has ended (etcd then sends no TTL: read
        here rather than by Lease.refresh, so as not to depend on how an etcd3gw release reads it)."""
        answer = self._do(
            lambda: self._client.post(self._client.get_url("/lease/keepalive"), json={"ID": lease})
        )
        return int(answer.get("result", {}).get("TTL", -1))

    def _revoke(self, lease: int) -> None:
        """Best effort: the lease ends by itself at its TTL anyway."""
        with contextlib.suppress(*FAILURES):
            self._do(lambda: Lease(lease, self._client).revoke())

    def _base(self, semaphore: str) -> str:
        return f"{self.prefix}sem/{semaphore}/"

    def _read(self, semaphore: str) -> _Seen:
        base = self._base(semaphore)
        guard, budget, slots = 0, 0, {}
        for value, meta in self._range(base):
            key = meta["key"].decode()
            if key == base + "guard":
                guard = int(meta["mod_revision"])
            elif key.startswith(base + "budget/"):
                budget += 1
            elif key.startswith(base + "holders/"):
                owner = key[len(base + "holders/") :]
                slots[owner] = _Slot(
                    owner, int(meta["create_revision"]), int(meta.get("lease", 0)), _json(value)
                )
        return _Seen(guard, slots, budget)

    # -- the semaphore ----------------------------------------------------------------------------

    async def acquire(
        self, semaphore: str, owner: str, limit: int, ttl: float, incident: str, budget: Budget | None = None
    ) -> Grant:
        return await self._run(
            "acquire", lambda: self._acquire(semaphore, owner, limit, ttl, incident, budget)
        )

    def _acquire(
        self, semaphore: str, owner: str, limit: int, ttl: float, incident: str, budget: Budget | None
    ) -> Grant:
        base = self._base(semaphore)
        leases: dict[str, int] = {}  # granted for the transaction; revoked unless it commits
        try:
            for attempt in range(ATTEMPTS):
                seen = self._read(semaphore)
                used = seen.budget if budget is not None else None
                holders = reasons.oldest_first(s.holder() for s in seen.slots.values())
                mine = seen.slots.get(owner)
                if mine is not None:
                    if self._renew(semaphore, owner, mine.token, ttl):
                        return Grant(mine.token, holders, budget_used=used)
                    continue  # its lease has just ended: read again
                if len(seen.slots) >= limit:
                    return Grant(None, holders, why=reasons.full(limit, holders), budget_used=used)
                if budget is not None and seen.budget >= budget.count:
                    return Grant(
                        None, holders, why=reasons.over_budget(seen.budget, budget), budget_used=used
                    )
                if "holder" not in leases:
                    leases["holder"] = self._grant_lease(ttl)
                if budget is not None and "budget" not in leases:
                    leases["budget"] = self._grant_lease(budget.window)
                now = self._now()
                value = {"since": now, "incident": incident, "ttl": _seconds(ttl), "expires": now + ttl}
                holder_key = base + "holders/" + owner
                success = [
                    _put(base + "guard", owner),
                    _put(holder_key, json.dumps(value), leases["holder"]),
                ]
                if budget is not None:
                    mark = {"at": now, "owner": owner, "window": budget.window}
                    success.append(
                        _put(f"{base}budget/{leases['budget']:x}", json.dumps(mark), leases["budget"])
                    )
                compare = [
                    {
                        "key": _b64(base + "guard"),
                        "result": "EQUAL",
                        "target": "MOD",
                        "mod_revision": str(seen.guard),
                    },
                    {"key": _b64(holder_key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"},
                ]
                answer = self._txn(compare, success)
                if answer.get("succeeded"):
                    token = int(answer["header"]["revision"])
                    leases.clear()  # both in use now
                    new = _Slot(owner, token, 0, value).holder()
                    return Grant(token, (*holders, new), budget_used=None if used is None else used + 1)
                time.sleep(random.uniform(0, 0.005 * (attempt + 1)))  # another grant came in between
            return Grant(None, holders, why=reasons.contended(ATTEMPTS), budget_used=used)
        finally:
            for lease in leases.values():
                self._revoke(lease)

    async def renew(self, semaphore: str, owner: str, token: int, ttl: float) -> bool:
        return await self._run("renew", lambda: self._renew(semaphore, owner, token, ttl))

    def _renew(self, semaphore: str, owner: str, token: int, ttl: float) -> bool:
        key = self._base(semaphore) + "holders/" + owner
        found = self._range_one(key, owner)
        if found is None or found.token != token:
            return False
        now = self._now()
        value = {**found.value, "ttl": _seconds(ttl), "expires": now + ttl}
        held = [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": str(token)}]
        if found.value.get("ttl") == _seconds(ttl):
            if self._keepalive(found.lease) <= 0:
                return False
            put = {"request_put": {"key": _b64(key), "value": _b64(json.dumps(value)), "ignore_lease": True}}
            return bool(self._txn(held, [put]).get("succeeded"))
        # Another ttl: the key moves to a new lease (a put keeps its create_revision: the token).
        lease = self._grant_lease(ttl)
        if self._txn(held, [_put(key, json.dumps(value), lease)]).get("succeeded"):
            self._revoke(found.lease)
            return True
        self._revoke(lease)
        return False

    def _range_one(self, key: str, name: str) -> _Slot | None:
        found = self._do(lambda: self._client.get(key.encode(), metadata=True))
        if not found:
            return None
        value, meta = found[0]
        return _Slot(name, int(meta["create_revision"]), int(meta.get("lease", 0)), _json(value))

    async def release(self, semaphore: str, owner: str, token: int) -> bool:
        return await self._run("release", lambda: self._release(semaphore, owner, token))

    def _release(self, semaphore: str, owner: str, token: int) -> bool:
        key = self._base(semaphore) + "holders/" + owner
        held = [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": str(token)}]
        answer = self._txn(held, [{"request_delete_range": {"key": _b64(key), "prev_kv": True}}])
        if not answer.get("succeeded"):
            return False
        for response in answer.get("responses", []):
            for kv in response.get("response_delete_range", {}).get("prev_kvs", []):
                if "lease" in kv:
                    self._revoke(int(kv["lease"]))
        return True

    async def holds(self, semaphore: str, owner: str, token: int) -> bool:
        key = self._base(semaphore) + "holders/" + owner

        def check() -> bool:
            found = self._range_one(key, owner)
            return found is not None and found.token == token

        return await self._run("holds", check)

    async def holders(self, semaphore: str) -> tuple[Holder, ...]:
        return await self._run("holders", lambda: self._holders(semaphore))

    def _holders(self, semaphore: str) -> tuple[Holder, ...]:
        slots = self._read(semaphore).slots.values()
        out = []
        for slot in slots:
            left = self._time_to_live(slot.lease)
            if left > 0:
                out.append(slot.holder(expires=self._now() + left))
        return reasons.oldest_first(out)

    def _time_to_live(self, lease: int) -> int:
        answer = self._do(
            lambda: self._client.post(self._client.get_url("/kv/lease/timetolive"), json={"ID": lease})
        )
        return int(answer.get("TTL", -1))

    async def budget_used(self, semaphore: str, window: float) -> int:
        """The budget keys still alive: each lives the window it was counted in (its lease's TTL),
        so ``window`` only matters when the grants were counted with it."""
        return await self._run("budget", lambda: self._read(semaphore).budget)

    async def register(self, host: str, ttl: float) -> None:
        if not host:
            raise ValueError("a host name is not empty")
        await self._run("register", lambda: self._register(host, ttl))

    def _register(self, host: str, ttl: float) -> None:
        key = f"{self.prefix}hosts/{host}"
        found = self._range_one(key, host)
        if found is not None and found.value.get("ttl") == _seconds(ttl) and self._keepalive(found.lease) > 0:
            return
        lease = self._grant_lease(ttl)
        self._do(
            lambda: self._client.put(
                key.encode(), json.dumps({"ttl": _seconds(ttl)}), lease=Lease(lease, self._client)
            )
        )
        if found is not None:
            self._revoke(found.lease)

    async def hosts(self) -> tuple[str, ...]:
        base = f"{self.prefix}hosts/"

        def names() -> tuple[str, ...]:
            return tuple(
                sorted(meta["key"].decode()[len(base) :] for _, meta in self._range(base, keys_only=True))
            )

        return await self._run("hosts", names)

    async def close(self) -> None:
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.session.close()


def _put(key: str, value: str, lease: int | None = None) -> dict[str, Any]:
    put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease is not None:
        put["lease"] = str(lease)
    return {"request_put": put}


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _reason(exc: BaseException) -> str:
    """A short reason: etcd's own message when it sent one, else the exception's first line."""
    if isinstance(exc, ConnectionFailedError):
        return "cannot connect" + (" (connection refused)" if "refused" in (exc.detail_text or "") else "")
    if isinstance(exc, ConnectionTimeoutError):
        return "timed out"
    if isinstance(exc, Etcd3Exception) and exc.detail_text:
        try:
            return str(json.loads(exc.detail_text).get("message", ""))[:200] or type(exc).__name__
        except (ValueError, AttributeError):
            return exc.detail_text.splitlines()[0][:200]
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
