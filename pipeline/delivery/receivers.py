"""A worker's webhook senders: a few threads of their own, off the step threads, one delivery
at a time per receiver, and backoff per receiver, so a receiver that is slow or never answers
costs other runs and other receivers nothing.

The `pipeline.notify` task only hands its webhook over (`hand_off`) and returns at once.
At most SENDERS deliveries are in flight per process, one per receiver, each over within its
total deadline (pipeline/http_deadline.py), and QUEUED more wait, at most PER_RECEIVER of one
receiver; past that, the task leaves the webhook to the tick, which sends it again later.
A receiver (scheme, host and
port) whose last send timed out, failed to connect or answered 5xx/429 is not tried again until
its backoff ends (doubling from FIRST_BACKOFF to LAST_BACKOFF), and then by one send at a time:
its other webhooks are put off without an attempt, instead of each holding a sender for a
timeout. The put-off is also written to their rows (pipeline/delivery/sender.py), so
the tick does not hand them to a worker again, one task and two transactions each, only to be
put off once more: that churn, on the workers' own threads, was what a tarpit cost other runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pipeline.logs import get_logger
from pipeline.reachability import DATABASE

log = get_logger("nightshift.notify")

SENDERS = 4
QUEUED = 64
PER_RECEIVER = 32
FIRST_BACKOFF = 2.0
LAST_BACKOFF = 300.0
MIN_DEFERRAL = 10.0
"""A webhook put off while its receiver's probe is in flight comes back no sooner: longer
than one send can take, so they do not each come back to find the probe still in flight."""


class Receivers:
    """When each receiver may be tried again (this process's view; a restart forgets it).

    One send at a time goes to a receiver that failed: while that probe is in flight, or its
    backoff lasts, the receiver's other webhooks are put off (`put_off`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}
        self._probing: set[str] = set()

    def put_off(self, receiver: str) -> float:
        """0 if a send to `receiver` may go now (then it is the receiver's probe until
        `sent`), else how many seconds to put it off."""
        with self._lock:
            failures = self._failures.get(receiver, 0)
            if failures == 0:
                return 0.0
            remaining = self._until.get(receiver, 0.0) - time.monotonic()
            if remaining > 0:  # back when the backoff ends (not all at the same instant)
                return random.uniform(remaining, 1.5 * remaining)
            if receiver not in self._probing:
                self._probing.add(receiver)
                return 0.0
            wait = max(MIN_DEFERRAL, min(LAST_BACKOFF, FIRST_BACKOFF * 2**failures))
            return random.uniform(wait, 1.5 * wait)

    def sent(self, receiver: str) -> None:
        """A send that `put_off` let go is over, however it ended: the next may probe."""
        with self._lock:
            self._probing.discard(receiver)

    def failed(self, receiver: str) -> float:
        """Seconds until `receiver` may be tried again (its next probe)."""
        with self._lock:
            failures = self._failures.get(receiver, 0) + 1
            self._failures[receiver] = failures
            wait = min(LAST_BACKOFF, FIRST_BACKOFF * 2 ** (failures - 1))
            self._until[receiver] = time.monotonic() + wait
            return wait

    def answered(self, receiver: str) -> bool:
        """Whether `receiver` was backed off until now."""
        with self._lock:
            self._until.pop(receiver, None)
            return self._failures.pop(receiver, None) is not None


class Senders:
    """SENDERS threads and room for QUEUED deliveries waiting, in a queue per receiver.

    A receiver has at most one delivery in flight in this process and at most PER_RECEIVER
    waiting: a receiver that holds its sender (for up to the send's total deadline) holds no
    other, and its backlog takes no room from other receivers' deliveries. Free senders take
    the receivers in turn."""

    def __init__(
        self, threads: int = SENDERS, queued: int = QUEUED, per_receiver: int = PER_RECEIVER
    ) -> None:
        self._room = queued
        self._per_receiver = per_receiver
        self._changed = threading.Condition()
        self._waiting: dict[str, deque[tuple[Callable[[str], Any], str]]] = {}
        self._turns: deque[str] = deque()
        """Receivers with a delivery waiting and none in flight, in the order they take turns."""
        self._busy: set[str] = set()
        """Receivers with a delivery in flight."""
        self._queued = 0
        for number in range(threads):
            name = f"nightshift-notify-{number}"
            threading.Thread(target=self._serve, name=name, daemon=True).start()

    def hand_off(self, send: Callable[[str], Any], key: str, receiver: str) -> bool:
        """Queue `send(key)` (a webhook's key); False when there is no room for it (the tick
        sends it again later)."""
        with self._changed:
            waiting = self._waiting.setdefault(receiver, deque())
            if self._queued >= self._room or len(waiting) >= self._per_receiver:
                if not waiting:
                    self._waiting.pop(receiver)
                return False
            waiting.append((send, key))
            self._queued += 1
            if len(waiting) == 1 and receiver not in self._busy:
                self._turns.append(receiver)
                self._changed.notify()
        return True

    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._turns:
                    self._changed.wait()
                receiver = self._turns.popleft()
                send, key = self._waiting[receiver].popleft()
                self._queued -= 1
                self._busy.add(receiver)
            try:
                send(key)
            except Exception as failure:  # its claim lapses and the tick sends it again
                _report(failure, key)
            finally:
                with self._changed:
                    self._busy.discard(receiver)
                    if self._waiting.get(receiver):
                        self._turns.append(receiver)
                        self._changed.notify()
                    else:
                        self._waiting.pop(receiver, None)


def _report(failure: Exception, key: str) -> None:
    """An outage is said once, by DATABASE; anything else here is a defect worth a line."""
    if DATABASE.is_outage(failure):
        DATABASE.failed(failure)
    else:
        log.error("webhook %s: its sender failed: %r", key, failure)


RECEIVERS = Receivers()
_senders: Senders | None = None
_senders_lock = threading.Lock()


def senders() -> Senders:
    """This process's senders, started on first use (nothing starts on import)."""
    global _senders
    with _senders_lock:
        if _senders is None:
            _senders = Senders()
        return _senders
