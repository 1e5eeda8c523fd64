"""Flow control at the one seam before a model call: the agent's max_concurrent_runs and the
model's rate limits, shared by every worker of every host (pipeline/engine/flow_ledger.py).

A call whose turn has not come does not wait in the worker: its run parks (status waiting,
reason max_concurrent_runs or rate_limit) and its step is replayed when its turn comes. A
run waiting for a turn is woken by the step that gives one back (the first waiters in order),
and by the tick at its recheck time should that wake be lost; a run waiting for the time the
rate limits reserved for its call is woken by the tick then. Either way it holds no worker
slot and no database connection meanwhile.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.exceptions

import pipeline.instruments as instruments
from models import RunStatus
from pipeline.agent_definition import Agent, Message
from pipeline.db import transaction
from pipeline.engine.actions import ParkRun
from pipeline.engine.flow_ledger import Pace, Turns
from pipeline.engine.leases import Lease
from pipeline.engine.llm import Reply, estimate_request_tokens
from pipeline.keys import rate_wait, turn_wait
from pipeline.logs import get_logger
from pipeline.runs.waits import wake_waiting_txn
from pipeline.settings import Settings

log = get_logger("nightshift.engine")

TURN_REASON = "max_concurrent_runs"
RATE_REASON = "rate_limit"
RECHECK_SECONDS = 10.0
"""A run waiting for a turn is looked at again by the tick after this (more, the further back
it waits) in case the wake its turn owed it was lost."""
MAX_RECHECK_SECONDS = 300.0


class _OutputSizes:
    """Per process: how many output tokens an agent's replies took lately (a moving average),
    the estimate a call is charged before its reply says."""

    def __init__(self) -> None:
        self._average: dict[str, float] = {}
        self._lock = threading.Lock()

    def expected(self, agent: str, room: int) -> int:
        with self._lock:
            average = self._average.get(agent)
        return min(room, round(average) if average is not None else min(room, 256))

    def saw(self, agent: str, tokens: int) -> None:
        with self._lock:
            average = self._average.get(agent)
            self._average[agent] = tokens if average is None else 0.8 * average + 0.2 * tokens


_OUTPUTS = _OutputSizes()


class Gate:
    """One step's flow control. `admit` before each model call (raises ParkRun when the turn
    has not come), `settle` with its reply, `leave` when the step ends, whatever ended it."""

    def __init__(self, lease: Lease, agent: Agent, model: str, settings: Settings) -> None:
        self.run_id, self.agent, self.model, self.settings = lease.run_id, agent, model, settings
        self.holder = f"{lease.run_id}:{lease.fence}"
        """This step's hold: a zombie step (its lease taken over) and its successor hold apart."""
        limit = agent.max_concurrent_runs
        self.turns = Turns(f"{settings.queue}:{agent.name}", limit) if limit else None
        rate = settings.rate_limit_of(model)
        key = hashlib.sha256((settings.anthropic_api_key or "").encode()).hexdigest()[:12]
        self.pace = Pace(f"{model}:{key}", rate) if rate else None
        self._holds_turn = False
        self._charged = (0, 0)

    def admit(self, messages: list[Message] | None, room: int = 0) -> None:
        """Before the step's reply: its turn, and unless the reply is replayed from the journal
        (`messages` None: a step resumed after its worker was lost, which runs its tools
        again), the rate limits' for the call."""
        try:
            if self.turns is not None and not self._holds_turn:
                self._take_turn(self.turns)
            if self.pace is not None and messages is not None:
                self._keep_pace(self.pace, messages, room)
        except redis.exceptions.RedisError as exc:  # the broker is away: so is every hand-off
            log.warning("flow control unavailable (%s); calling the model without it", exc)

    def _take_turn(self, turns: Turns) -> None:
        hold = self.settings.step_time_limit + self.settings.lease_seconds
        waits = turns.ask(str(self.run_id), hold, RECHECK_SECONDS, MAX_RECHECK_SECONDS,
                          self.holder)  # fmt: skip
        if waits is None:
            self._holds_turn = True
            return
        ahead, recheck = waits
        instruments.FLOW_WAITS.labels(TURN_REASON, self.agent.name).inc()
        why = (f"waiting for a turn: {turns.limit} run(s) of {self.agent.name} are in a step "
               f"(max_concurrent_runs), {ahead} waiting before this one")  # fmt: skip
        raise ParkRun(RunStatus.WAITING, turn_wait(self.agent.name), _after(recheck),
                      reason=(TURN_REASON, why))  # fmt: skip

    def _keep_pace(self, pace: Pace, messages: list[Message], room: int) -> None:
        charged = (estimate_request_tokens(self.agent, messages),
                   _OUTPUTS.expected(self.agent.name, room))  # fmt: skip
        wait = pace.ask(str(self.run_id), *charged)
        if wait <= 0:
            self._charged = charged
            return
        instruments.FLOW_WAITS.labels(RATE_REASON, self.model).inc()
        at = _after(wait)
        why = f"waiting for its turn under {self.model}'s rate limits, until {at:%H:%M:%S} UTC"
        raise ParkRun(RunStatus.WAITING, rate_wait(self.model), at, reason=(RATE_REASON, why))

    def settle(self, reply: Reply) -> None:
        usage: dict[str, Any] = reply.get("usage") or {}
        output = int(usage.get("output_tokens") or 0)
        _OUTPUTS.saw(self.agent.name, output)
        if self.pace is None or self._charged == (0, 0):
            return
        prompt = sum(int(usage.get(k) or 0) for k in (
            "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))  # fmt: skip
        charged_input, charged_output = self._charged
        self._charged = (0, 0)
        try:
            self.pace.settle(prompt - charged_input, output - charged_output)
        except redis.exceptions.RedisError as exc:
            log.warning("flow control unavailable (%s); this call's usage is not settled", exc)

    def leave(self) -> None:
        """The step ended: give its turn back and wake the waiters whose turn it is now (a run
        that has just parked for a turn wakes itself this way if one came free meanwhile)."""
        if self.turns is None:
            return
        self._holds_turn = False
        try:
            due = self.turns.leave(self.holder)
        except redis.exceptions.RedisError as exc:
            log.warning("flow control unavailable (%s); its holds lapse by themselves", exc)
            return
        if not due:
            return
        with transaction() as session:
            runs = [uuid.UUID(run) for run in due]
            wake_waiting_txn(session, runs, str(turn_wait(self.agent.name)))


def _after(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)
