"""The fleet-wide ledgers of flow control, in the broker's Redis: every worker of every host asks
the same keys, each question one Lua script (atomic, on Redis's own clock).

Turns (an agent's max_concurrent_runs): the steps holding a turn, by run and fence (a sorted set
scored by when their hold lapses, so a dead worker's holds free themselves; a step whose lease
was taken over keeps its own hold until it ends, and its end never frees its successor's) and
the runs waiting, in the order they first asked (first in, first out: a run that comes later
queues behind them, so none starves).
A waiter that stops asking (cancelled, failed, its deadline passed) is forgotten.

Pace (a model's rate limits): the generic cell rate algorithm per limit (requests, input tokens,
output tokens a minute): a "theoretical arrival time" each, pushed on by what every call costs.
A call the limits cannot take now gets a reserved time (a ticket), so the runs that wait each
have their own turn and do not all come back at once; a call's real usage settles its estimate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis.commands.core import Script

from pipeline.app import app
from pipeline.rate_limits import RateLimit

PREFIX = "nightshift:flow"
BURST_SECONDS = 6.0
"""How far ahead of now the pace may run: a tenth of a minute's worth at once (one larger call:
its own cost, up to 54 s worth, once the calls before it are paid). A provider's own bucket
holds a minute's worth, so what the estimates miss fits in the rest."""

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1e6\n"

_ASK_TURN = (
    _NOW
    + """
local holders, queue, seen, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local run, limit, hold = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local recheck, most, holder = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', seen, '-inf', now, 'LIMIT', 0, 500)
if #gone > 0 then
  redis.call('ZREM', queue, unpack(gone))
  redis.call('ZREM', seen, unpack(gone))
end
local keep = math.ceil(hold + 3 * most + 60)
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, keep) end
if redis.call('ZSCORE', holders, holder) then
  redis.call('ZADD', holders, now + hold, holder)
  return {1, 0}
end
local free = limit - redis.call('ZCARD', holders)
local rank = redis.call('ZRANK', queue, run)
local ahead = rank or redis.call('ZCARD', queue)
if ahead < free then
  redis.call('ZADD', holders, now + hold, holder)
  redis.call('ZREM', queue, run)
  redis.call('ZREM', seen, run)
  return {1, 0}
end
if not rank then redis.call('ZADD', queue, redis.call('INCR', seq), run) end
-- Further back, it is looked at less often; forgotten unless it asks again within thrice that.
local wait = math.min(most, recheck * (1 + math.floor(ahead / math.max(limit, 1))))
redis.call('ZADD', seen, now + 3 * wait, run)
return {0, ahead, tostring(wait)}
"""
)

_LEAVE_TURN = (
    _NOW
    + """
local holders, queue = KEYS[1], KEYS[2]
local holder, limit = ARGV[1], tonumber(ARGV[2])
redis.call('ZREM', holders, holder)
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
local free = limit - redis.call('ZCARD', holders)
if free <= 0 then return {} end
return redis.call('ZRANGE', queue, 0, free - 1)
"""
)

_ASK_PACE = (
    _NOW
    + """
local cells, ticket = KEYS[1], KEYS[2]
local burst = tonumber(ARGV[1])
local reserved = redis.call('GET', ticket)
if reserved then
  local at = tonumber(reserved)
  if at <= now + 0.05 then
    redis.call('DEL', ticket)
    return {1, '0'}
  end
  return {0, tostring(at - now)}
end
local allow, tats = now, {}
for i = 1, 3 do
  local per_minute, cost = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if per_minute > 0 then
    local tat = tonumber(redis.call('HGET', cells, i) or '0')
    if tat < now then tat = now end
    local seconds = math.min(cost, per_minute) * 60 / per_minute
    tats[i] = tat + seconds
    -- One call larger than the burst goes once what came before is paid (up to what the
    -- provider's minute holds besides a burst), instead of waiting for its own cost.
    local ahead = math.max(burst, math.min(seconds, 60 - burst))
    if tats[i] - ahead > allow then allow = tats[i] - ahead end
  end
end
for i, tat in pairs(tats) do redis.call('HSET', cells, i, tostring(tat)) end
redis.call('EXPIRE', cells, 3600)
if allow <= now then return {1, '0'} end
redis.call('SET', ticket, tostring(allow), 'EX', math.ceil(allow - now + 600))
return {0, tostring(allow - now)}
"""
)

_SETTLE_PACE = (
    _NOW
    + """
local cells = KEYS[1]
for i = 1, 3 do
  local per_minute, delta = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local tat = redis.call('HGET', cells, i)
  if per_minute > 0 and delta ~= 0 and tat then
    local moved = tonumber(tat) + delta * 60 / per_minute
    if moved < now then moved = now end
    redis.call('HSET', cells, i, tostring(moved))
  end
end
return 1
"""
)


class _Scripts:
    """The Lua scripts, loaded into Redis once and called by their digest (redis-py's Script
    loads a script again after a Redis restart)."""

    def __init__(self) -> None:
        self._by_source: dict[str, Script] = {}

    def run(self, client: Any, source: str, keys: list[str], args: list[Any]) -> Any:
        script = self._by_source.get(source)
        if script is None:
            script = self._by_source[source] = Script(client, source)
        return script(keys=keys, args=args, client=client)


_SCRIPTS = _Scripts()


@contextmanager
def _redis() -> Iterator[Any]:
    """A client of this process's broker connection pool (the one step messages go through)."""
    with app.producer_or_acquire() as producer, producer.channel.conn_or_acquire() as client:
        yield client


def _call(source: str, keys: list[str], args: list[Any]) -> Any:
    with _redis() as client:
        return _SCRIPTS.run(client, source, keys, args)


@dataclass(frozen=True)
class Turns:
    """One agent's max_concurrent_runs in one environment (queue)."""

    scope: str
    """`<queue>:<agent>`."""
    limit: int

    def _keys(self) -> list[str]:
        base = f"{PREFIX}:turns:{self.scope}"
        return [f"{base}:holders", f"{base}:queue", f"{base}:seen", f"{base}:seq"]

    def ask(
        self,
        run_id: str,
        hold_seconds: float,
        recheck_seconds: float,
        most_seconds: float,
        holder: str | None = None,
    ) -> tuple[int, float] | None:
        """None: the run holds a turn now (for `hold_seconds`, unless it leaves sooner; asking
        again renews it). Else how many waiters are before it and when to ask again at the
        latest (`recheck_seconds` more for each `limit` of them, at most `most_seconds`): it
        loses its place if it has not asked again within thrice that. `holder`: the step asking
        (`<run>:<fence>`; default the run): a waiter keeps its place by run across steps."""
        args = [run_id, self.limit, hold_seconds, recheck_seconds, most_seconds, holder or run_id]
        answer = _call(_ASK_TURN, self._keys(), args)
        return None if answer[0] else (int(answer[1]), float(answer[2]))

    def leave(self, holder: str) -> list[str]:
        """Give the holder's turn back (nothing if it held none): the waiters (runs) whose turn
        it is now."""
        due: list[bytes] = _call(_LEAVE_TURN, self._keys()[:2], [holder, self.limit])
        return [item.decode() for item in due]


@dataclass(frozen=True)
class Pace:
    """One model's rate limits under one API key."""

    scope: str
    """`<model>:<digest of the API key>`."""
    limit: RateLimit

    def _per_minute(self) -> tuple[float, float, float]:
        limit = self.limit
        return (limit.requests_per_minute or 0.0, limit.input_tokens_per_minute or 0.0,
                limit.output_tokens_per_minute or 0.0)  # fmt: skip

    def ask(self, run_id: str, input_tokens: int, output_tokens: int) -> float:
        """0: the call may go now, its estimated cost counted. Else the seconds until the time
        reserved for it (asking again then lets it go without counting it twice)."""
        costs = (1, input_tokens, output_tokens)
        args: list[Any] = [BURST_SECONDS]
        for per_minute, cost in zip(self._per_minute(), costs, strict=True):
            args += [per_minute, cost]
        keys = [f"{PREFIX}:pace:{self.scope}", f"{PREFIX}:ticket:{self.scope}:{run_id}"]
        admitted, wait = _call(_ASK_PACE, keys, args)
        return 0.0 if admitted else float(wait)

    def settle(self, input_delta: int, output_delta: int) -> None:
        """A call's real usage minus its estimate: later calls pay for what it used."""
        rpm, ipm, opm = self._per_minute()
        _call(_SETTLE_PACE, [f"{PREFIX}:pace:{self.scope}"],
              [rpm, 0, ipm, input_delta, opm, output_delta])  # fmt: skip
