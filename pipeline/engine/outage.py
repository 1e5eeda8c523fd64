"""A model call that waits out a provider outage instead of failing its run.

429, 529, 5xx and connection errors are temporary: the step retries briefly (MODEL_RETRY,
never sooner than a reply's retry-after). Past that, or as soon as an outage of that model is
already open, or when retry-after asks for longer than the brief retries last, the run gives
up for now: the outage row (pipeline/runs/outages.py) is opened or pushed back and the run
parks on `model:<model>`, holding no slot, until the tick's one probe got a reply and the run's
turn to resume came. It fails `model_unavailable` only once the outage has lasted the horizon
(NIGHTSHIFT_MODEL_OUTAGE_HORIZON_SECONDS) or its deadline passed.

A process remembers which models failed here lately; only a step of such a model reads the
outage row before calling. Everything else that decides is in PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from models import RunStatus
from pipeline.db import transaction
from pipeline.engine.actions import ParkRun
from pipeline.engine.leases import Lease, fenced
from pipeline.engine.llm import Reply
from pipeline.errors import PermanentError, RunStopped, TemporaryError
from pipeline.keys import model_wait
from pipeline.logs import get_logger
from pipeline.retry import RetryPolicy, classify, retry_after
from pipeline.runs.outages import Outage, gave_up_txn, outage_of_txn
from pipeline.settings import Settings

log = get_logger("nightshift.engine")

MODEL_RETRY = RetryPolicy(attempts=6, base_seconds=0.5, cap_seconds=15.0)
"""The brief retries in the step: at most ~15 s in all before the run parks."""
REASON = "model_unavailable"
WAITING_REASON = "model_outage"
"""The run's stop reason while it waits out an outage (cleared when it is woken)."""


class _Suspects:
    """Models whose calls failed in this process and whose outage may still be open."""

    def __init__(self) -> None:
        self._models: set[str] = set()
        self._lock = threading.Lock()

    def __contains__(self, model: object) -> bool:
        with self._lock:
            return model in self._models

    def add(self, model: str) -> None:
        with self._lock:
            self._models.add(model)

    def discard(self, model: str) -> None:
        with self._lock:
            self._models.discard(model)


_SUSPECTS = _Suspects()


@dataclass
class ModelCall:
    """One step's model call for one run, through any outage of its model."""

    lease: Lease
    model: str
    settings: Settings
    before_retry: Callable[[], None]
    """Runs before each retry (the step stops there if its lease is gone)."""
    sleep: Callable[[float], None] = time.sleep
    _probing: bool = field(default=False, init=False)

    def reply(self, call: Callable[[], Reply]) -> Reply:
        if self.model in _SUSPECTS:
            self._park_if_down()
        attempt = 0
        while True:
            try:
                reply = call()
            except Exception as exc:
                error = classify(exc)
                if isinstance(error, PermanentError):
                    raise error from exc
                self._after_failure(error, retry_after(exc), attempt)
                attempt += 1
                continue
            _SUSPECTS.discard(self.model)
            return reply

    def _after_failure(self, error: TemporaryError, wait: float | None, attempt: int) -> None:
        """Sleep before the next attempt, or give up for now (raises ParkRun)."""
        _SUSPECTS.add(self.model)
        if self._probing or self._open_outage() is not None:
            self._give_up(error, wait)  # the probe asks once; an open outage is not news
        delay = max(MODEL_RETRY.delay(attempt), wait or 0.0)
        if attempt + 1 >= MODEL_RETRY.attempts or delay > MODEL_RETRY.cap_seconds:
            self._give_up(error, wait)
        log.warning("model %s: temporary error, retry %d in %.2fs: %s",
                    self.model, attempt + 1, delay, error)  # fmt: skip
        self.sleep(delay)
        self.before_retry()

    def _open_outage(self) -> Outage | None:
        """The model's open outage, if any; notes whether this run is the one probing it."""
        with transaction() as session:
            outage = outage_of_txn(session, self.model)
        if outage is None or outage.recovered:
            return None
        self._probing = outage.probe_run_id == self.lease.run_id
        return outage

    def _park_if_down(self) -> None:
        """Before calling a model that failed here lately: wait with the others if it is still
        down and this run is not its probe."""
        outage = self._open_outage()
        if outage is None:
            _SUSPECTS.discard(self.model)
        elif not self._probing:
            raise self._park(outage)

    def _give_up(self, error: TemporaryError, wait: float | None) -> None:
        with fenced(self.lease) as session:
            outage = gave_up_txn(
                session, self.model, self.lease.run_id, str(error), wait, self.settings
            )
        log.warning("model %s is down (%s); the run waits for it", self.model, error)
        raise self._park(outage)

    def _park(self, outage: Outage) -> BaseException:
        gives_up_at = outage.gives_up_at(self.settings)
        since = f"{outage.since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        if gives_up_at <= datetime.now(UTC):
            return RunStopped(
                REASON,
                f"the model provider has been unavailable since {since}, past "
                f"NIGHTSHIFT_MODEL_OUTAGE_HORIZON_SECONDS: {outage.last_error}",
            )
        why = f"waiting for {self.model} to answer again (down since {since}): "
        return ParkRun(
            RunStatus.WAITING,
            model_wait(self.model),
            wake_at=gives_up_at,
            reason=(WAITING_REASON, why + outage.last_error),
        )
