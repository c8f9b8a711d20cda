"""The fleet's semaphore on Redis, through redis-py's asyncio client: one Lua script per operation,
so that each is atomic on the server.

Keys, under the configured prefix (``specguard/``):

- ``sem/<name>/holders``: a sorted set, owner -> lease expiry (unix milliseconds);
- ``sem/<name>/info``: a hash, owner -> JSON ``{token, since, incident}`` of its grant;
- ``sem/<name>/budget``: a sorted set of the grants counted against a budget, token -> grant time;
- ``tokens``: the counter the fencing tokens come from (``INCR``: it only grows, fleet-wide). It
  starts at the time in milliseconds, so a Redis that lost it (restarted without persistence)
  still gives tokens above the ones it gave before;
- ``hosts``: a sorted set, host -> registration expiry.

Every script first drops the holders whose lease has ended (``ZRANGEBYSCORE``/``ZREM``/``HDEL``),
so a crashed holder's slot is free for the next caller without anyone cleaning up. Time is Redis's
own (``TIME`` inside the script), one clock for the whole fleet; a Coordinator given ``clock``
passes its time instead (a test's fake clock).

One Redis server (with replicas if wanted), not a Redis Cluster: a script's keys would lie in
different hash slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from specguard.coordination import reasons
from specguard.coordination.base import Budget, Coordinator, Grant, Holder, Unavailable

T = TypeVar("T")

# Shared by every script: the time (ARGV[n] when the client gives one, else Redis's TIME), the
# removal of ended leases, and the listing of the holders left.
_COMMON = """
local function now_of(given)
  local now = tonumber(given)
  if now then return now end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function drop_ended(holders, info, now)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  if #gone > 0 then
    redis.call('ZREM', holders, unpack(gone))
    redis.call('HDEL', info, unpack(gone))
  end
end
local function listing(holders, info)
  local out = {}
  local members = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
  for i = 1, #members, 2 do
    out[#out + 1] = members[i]
    out[#out + 1] = members[i + 1]
    out[#out + 1] = redis.call('HGET', info, members[i]) or ''
  end
  return out
end
local function token_of(info, owner)
  local raw = redis.call('HGET', info, owner)
  if not raw then return nil end
  return tonumber(cjson.decode(raw)['token'])
end
local function held_under(holders, info, owner, token)
  return redis.call('ZSCORE', holders, owner) and token_of(info, owner) == tonumber(token)
end
"""

# KEYS: holders, info, budget, tokens. ARGV: owner, limit, ttl ms, incident, budget count (0: no
# budget), budget window ms, now ms ('' for Redis's TIME).
# Returns {outcome, token, budget used (-1: no budget), now, listing}.
_ACQUIRE = (
    _COMMON
    + """
local holders, info, budget, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, limit, ttl, incident = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local count, window = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_of(ARGV[7])
drop_ended(holders, info, now)
local used = -1
if count > 0 then
  redis.call('ZREMRANGEBYSCORE', budget, '-inf', now - window)
  used = redis.call('ZCARD', budget)
end
if redis.call('ZSCORE', holders, owner) then
  local token = token_of(info, owner)
  if token then
    redis.call('ZADD', holders, now + ttl, owner)
    return {'held', token, used, now, listing(holders, info)}
  end
  redis.call('ZREM', holders, owner)
end
if redis.call('ZCARD', holders) >= limit then
  return {'full', 0, used, now, listing(holders, info)}
end
if count > 0 and used >= count then
  return {'budget', 0, used, now, listing(holders, info)}
end
if redis.call('EXISTS', tokens) == 0 then
  -- A new (or emptied: restarted without persistence) Redis: start from the time in ms, above
  -- any token an earlier counter gave unless it granted more than once a millisecond.
  redis.call('SET', tokens, now)
end
local token = redis.call('INCR', tokens)
redis.call('ZADD', holders, now + ttl, owner)
redis.call('HSET', info, owner, cjson.encode({token = token, since = now, incident = incident}))
if count > 0 then
  redis.call('ZADD', budget, now, tostring(token))
  used = used + 1
end
return {'granted', token, used, now, listing(holders, info)}
"""
)

# KEYS: holders, info. ARGV: owner, token, ttl ms, now ms. 1: renewed; 0: not held under token.
_RENEW = (
    _COMMON
    + """
local now = now_of(ARGV[4])
drop_ended(KEYS[1], KEYS[2], now)
if not held_under(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1
"""
)

# KEYS: holders, info. ARGV: owner, token, now ms. 1: released; 0: not held under token.
_RELEASE = (
    _COMMON
    + """
local now = now_of(ARGV[3])
drop_ended(KEYS[1], KEYS[2], now)
if not held_under(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""
)

# KEYS: holders, info. ARGV: owner, token, now ms. 1: held under token and not ended.
_HOLDS = (
    _COMMON
    + """
local now = now_of(ARGV[3])
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now or token_of(KEYS[2], ARGV[1]) ~= tonumber(ARGV[2]) then
  return 0
end
return 1
"""
)

# KEYS: holders, info. ARGV: now ms. The listing of the holders whose lease has not ended.
_HOLDERS = (
    _COMMON
    + """
local now = now_of(ARGV[1])
drop_ended(KEYS[1], KEYS[2], now)
return {now, listing(KEYS[1], KEYS[2])}
"""
)

# KEYS: budget. ARGV: window ms, now ms. Grants counted in the last window.
_BUDGET_USED = (
    _COMMON
    + """
local now = now_of(ARGV[2])
return redis.call('ZCOUNT', KEYS[1], '(' .. (now - tonumber(ARGV[1])), '+inf')
"""
)

# KEYS: hosts. ARGV: host ('' to only list), ttl ms, now ms. The hosts registered and not expired.
_HOSTS = (
    _COMMON
    + """
local now = now_of(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[1] ~= '' then redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1]) end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class RedisCoordinator(Coordinator):
    """A Coordinator on one Redis (``client``: redis-py's asyncio client, ``decode_responses=True``).
    ``where``: the server as messages name it (host:port, never a password)."""

    name = "redis"

    def __init__(
        self,
        client: Redis,
        where: str,
        prefix: str,
        timeout: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(prefix, timeout, clock)
        self._client = client
        self._where = where
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._holds = client.register_script(_HOLDS)
        self._holders = client.register_script(_HOLDERS)
        self._budget_used = client.register_script(_BUDGET_USED)
        self._hosts = client.register_script(_HOSTS)

    def _keys(self, semaphore: str) -> list[str]:
        base = f"{self.prefix}sem/{semaphore}/"
        return [base + "holders", base + "info"]

    def _now(self) -> str:
        """The time the scripts use: empty for Redis's own, else the given clock's, in ms."""
        return "" if self.clock is None else str(_ms(self.clock()))

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(call, self.timeout)
        except TimeoutError:
            raise Unavailable(f"redis at {self._where}: {what}: no answer in {self.timeout:g}s") from None
        except (RedisError, OSError) as exc:
            reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise Unavailable(f"redis at {self._where}: {what}: {reason}") from exc

    async def acquire(
        self, semaphore: str, owner: str, limit: int, ttl: float, incident: str, budget: Budget | None = None
    ) -> Grant:
        keys = [*self._keys(semaphore), f"{self.prefix}sem/{semaphore}/budget", f"{self.prefix}tokens"]
        count, window = (budget.count, _ms(budget.window)) if budget is not None else (0, 0)
        args: list[str | int] = [owner, limit, _ms(ttl), incident, count, window, self._now()]
        answer = await self._call("acquire", self._acquire(keys=keys, args=args))
        outcome, token, used, _, rows = answer
        holders = _holders(rows)
        used_or_none = None if int(used) < 0 else int(used)
        if outcome in ("granted", "held"):
            return Grant(int(token), holders, budget_used=used_or_none)
        if outcome == "full":
            why = reasons.full(limit, holders)
        else:
            assert budget is not None
            why = reasons.over_budget(int(used), budget)
        return Grant(None, holders, why=why, budget_used=used_or_none)

    async def renew(self, semaphore: str, owner: str, token: int, ttl: float) -> bool:
        args: list[str | int] = [owner, token, _ms(ttl), self._now()]
        return bool(await self._call("renew", self._renew(keys=self._keys(semaphore), args=args)))

    async def release(self, semaphore: str, owner: str, token: int) -> bool:
        args: list[str | int] = [owner, token, self._now()]
        return bool(await self._call("release", self._release(keys=self._keys(semaphore), args=args)))

    async def holds(self, semaphore: str, owner: str, token: int) -> bool:
        args: list[str | int] = [owner, token, self._now()]
        return bool(await self._call("holds", self._holds(keys=self._keys(semaphore), args=args)))

    async def holders(self, semaphore: str) -> tuple[Holder, ...]:
        answer = await self._call("holders", self._holders(keys=self._keys(semaphore), args=[self._now()]))
        return _holders(answer[1])

    async def budget_used(self, semaphore: str, window: float) -> int:
        keys = [f"{self.prefix}sem/{semaphore}/budget"]
        return int(await self._call("budget", self._budget_used(keys=keys, args=[_ms(window), self._now()])))

    async def register(self, host: str, ttl: float) -> None:
        if not host:
            raise ValueError("a host name is not empty")
        await self._call(
            "register", self._hosts(keys=[f"{self.prefix}hosts"], args=[host, _ms(ttl), self._now()])
        )

    async def hosts(self) -> tuple[str, ...]:
        answer = await self._call(
            "hosts", self._hosts(keys=[f"{self.prefix}hosts"], args=["", 0, self._now()])
        )
        return tuple(sorted(str(h) for h in answer))

    async def close(self) -> None:
        with contextlib.suppress(TimeoutError, RedisError, OSError):  # let go either way
            await asyncio.wait_for(self._client.aclose(), self.timeout)


def _holders(rows: Sequence[Any]) -> tuple[Holder, ...]:
    """Holders from a script's listing: owner, expiry (ms), grant JSON, for each."""
    out = []
    for i in range(0, len(rows) - 2, 3):
        owner, expiry, raw = str(rows[i]), float(rows[i + 1]), rows[i + 2]
        grant: dict[str, Any] = json.loads(raw) if raw else {}
        out.append(
            Holder(
                owner=owner,
                token=int(grant.get("token", 0)),
                since=float(grant.get("since", 0)) / 1000,
                expires=expiry / 1000,
                incident=str(grant.get("incident", "")),
            )
        )
    return reasons.oldest_first(out)
