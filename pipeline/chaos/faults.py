"""The chaos harness's faults: a schedule drawn up front from the seed (pipeline/chaos/injector.py
injects them), and the approvals the harness fires."""

from __future__ import annotations

import hashlib
import json
import random
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy import text

from pipeline.chaos.common import ChaosError, WebhookUnavailable
from pipeline.chaos.webhook import ApprovalWebhook, Delivery
from pipeline.db import transaction

KINDS = (
    "kill", "stop", "redis", "postgres", "duplicate", "webhook",
    "cut_postgres", "cut_redis", "wipe", "slow_service", "lying_service", "postgres_in_send",
    "model_outage",
)  # fmt: skip
"""kill: SIGKILL a worker or a pool child; stop: SIGSTOP one past its lease; redis, postgres:
restart the server; duplicate: a step message sent twice; webhook: one signed approval delivery
posted twice at once (the second must be refused as a replay); cut_postgres, cut_redis: a
worker host partitioned from the server past the lease, then healed; wipe: the broker loses
everything (FLUSHALL, or a fresh empty Redis on its port); slow_service: a service answers only
after the lease ran out, having done the work; lying_service: a service does the work and
answers 503; postgres_in_send: PostgreSQL restarts while a side effect's send is in flight;
model_outage: the Messages API answers 529, or 429 with a retry-after, to every request for
10-30 s (the runs must wait it out, none may fail model_unavailable)."""
NETWORK_KINDS = frozenset({"cut_postgres", "cut_redis"})
"""Kinds that need worker hosts (network namespaces)."""
DEFAULT_WEIGHTS = (
    "kill=3,stop=2,redis=1,postgres=1,duplicate=2,webhook=2,cut_postgres=2,cut_redis=1.5,"
    "wipe=0.8,slow_service=1,lying_service=1,postgres_in_send=0.6,"
    "model_outage=0.3"
)
SERVICES = ("email", "pricing", "githost")
"""The sandbox services side effects go to."""
RETRIES, RETRY_SECONDS = 3, 4.0
"""A fault with no target (no pending approval, no busy worker) is tried again this often."""
RESUMABLE = frozenset(KINDS) - {"duplicate", "webhook", "model_outage"}
"""Kinds that take a run away from its worker: the time until its next claim is measured."""


@dataclass(frozen=True)
class Fault:
    """One planned fault. Its target is chosen when it fires, among what exists then."""

    index: int
    at: float
    """Seconds after the workload started."""
    kind: str
    pick: float
    """Which target, in [0, 1): an index into the sorted candidates at firing time."""
    hold: float = 0.0
    """stop: seconds frozen; redis, postgres, postgres_in_send, wipe (fresh): seconds down
    between stop and start; cut_*: seconds partitioned; *_service, model_outage: seconds
    misbehaving."""
    mode: str = ""
    """kill: worker|child; redis: term|kill; postgres, postgres_in_send: fast|immediate;
    wipe: flushall|fresh; *_service: which service; model_outage: 529|429."""
    delay: float = 0.0
    """slow_service: seconds each reply waits after the work was done; model_outage (429): the
    retry-after it asks for."""

    def describe(self) -> str:
        says = "retry-after" if self.kind == "model_outage" else "replies after"
        delay = f"{says} {self.delay:.1f}s" if self.delay else ""
        extra = " ".join(
            x for x in (self.mode, f"{self.hold:.1f}s" if self.hold else "", delay) if x
        )
        return f"#{self.index:03d} +{self.at:6.1f}s {self.kind}" + (f" ({extra})" if extra else "")


@dataclass
class FaultRecord:
    """What happened when a fault fired."""

    fault: Fault
    fired_at: float
    injected: bool
    wall: str = ""
    """Wall-clock time it fired, to line it up with the worker logs."""
    target: str = ""
    affected: list[str] = field(default_factory=list)
    """Runs the fault hit: held by the frozen or killed worker, in flight during a restart,
    sent twice, or approved twice."""
    note: str = ""


def write_fault_log(path: Path, records: list[FaultRecord]) -> None:
    """One line per fault as it fired: when, what it hit, which runs."""
    lines = []
    for r in records:
        outcome = "injected" if r.injected else "not injected"
        lines.append(
            f"{r.wall} {r.fault.describe()} fired +{r.fired_at:.1f}s {outcome}: {r.target or '-'}"
            + (f" runs={','.join(r.affected)}" if r.affected else "")
            + (f" [{r.note}]" if r.note else "")
        )
    path.write_text("\n".join(lines) + "\n")


def parse_weights(text: str) -> dict[str, float]:
    """`kill=3,stop=2` -> {"kill": 3.0, "stop": 2.0, others: 0}."""
    weights = dict.fromkeys(KINDS, 0.0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in weights:
            raise ChaosError(f"unknown fault kind {name!r}; known: {', '.join(KINDS)}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ChaosError(f"fault weight for {name} must be a number (got {value!r})") from None
        if weights[name] < 0:
            raise ChaosError(f"fault weight for {name} must not be negative")
    if not any(weights.values()):
        raise ChaosError("at least one fault kind needs a positive weight")
    return weights


def plan_faults(
    seed: int, duration: float, rate: float, weights: Mapping[str, float], lease_seconds: float
) -> list[Fault]:
    """The whole schedule, from the seed alone: the same seed gives the same faults.

    `rate` faults a minute; every kind with a positive weight appears at least once (when
    there are enough faults), the rest are drawn by weight. Times are spread over the run,
    after a short warm-up and before the very end.
    """
    rng = random.Random(seed)
    count = max(1, round(rate * duration / 60))
    kinds = [k for k in KINDS if weights.get(k, 0) > 0]
    drawn = kinds[:count] + rng.choices(
        kinds, [weights[k] for k in kinds], k=max(0, count - len(kinds))
    )
    rng.shuffle(drawn)
    start, end = min(10.0, duration * 0.05), duration * 0.97
    times = sorted(rng.uniform(start, end) for _ in drawn)
    faults = []
    for index, (at, kind) in enumerate(zip(times, drawn, strict=True)):
        pick, hold, mode, delay = rng.random(), 0.0, "", 0.0
        if kind == "kill":
            mode = rng.choice(("worker", "child"))
        elif kind == "stop":
            # Past the lease, and sometimes past the doubled lease of a send in flight.
            hold = rng.uniform(lease_seconds + 1, lease_seconds * 3)
        elif kind == "redis":
            mode, hold = rng.choice(("term", "term", "kill")), rng.uniform(0, 2)
        elif kind in ("postgres", "postgres_in_send"):
            mode, hold = rng.choice(("fast", "fast", "immediate")), rng.uniform(0, 2)
        elif kind in NETWORK_KINDS:
            hold = rng.uniform(lease_seconds + 1, lease_seconds * 4)
        elif kind == "wipe":
            mode, hold = rng.choice(("flushall", "flushall", "fresh")), rng.uniform(0, 1)
        elif kind == "slow_service":
            mode, hold = rng.choice(SERVICES), rng.uniform(6, 15)
            delay = rng.uniform(lease_seconds * 1.5, lease_seconds * 3)
        elif kind == "lying_service":
            mode, hold = rng.choice(SERVICES), rng.uniform(3, 8)
        elif kind == "model_outage":
            mode, hold = rng.choice(("529", "429")), rng.uniform(10, 30)
            delay = rng.uniform(3, 15) if mode == "429" else 0.0
        faults.append(
            Fault(index, round(at, 3), kind, round(pick, 6), round(hold, 3), mode, round(delay, 3))
        )
    return faults


def schedule_hash(faults: list[Fault]) -> str:
    text = json.dumps([asdict(f) for f in faults], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pending_approvals() -> list[str]:
    """Keys of the actions waiting for a person's approval, oldest first."""

    query = text(
        "SELECT idempotency_key FROM actions WHERE state = 'pending_approval' ORDER BY created_at"
    )
    with transaction() as session:
        return list(session.scalars(query))


APPROVER = "chaos-approver@example.com"
"""Named as the approver of every approval-requiring tool on the harness's workers."""


class Approvals:
    """Every approval the harness fires (the workload's and the webhook faults'), sent as a
    person's would be: signed, with the approver's token, to the API's approval webhook. It
    checks that exactly one delivery per action came back as the first decision, and that a
    delivery sent twice was refused the second time (a replay)."""

    def __init__(self, webhook: ApprovalWebhook) -> None:
        self.webhook = webhook
        self.lock = threading.Lock()
        self.firsts: Counter[str] = Counter()
        self.calls = 0
        self.concurrent = 0
        """Approvals fired from two threads at the same instant."""
        self.replays_refused = 0
        self.replays_accepted = 0
        """The same signed delivery accepted more than once: the replay cache failed."""
        self.errors: list[str] = []
        self.log: list[str] = []
        """One line per call: wall-clock time, key, outcome (written to approvals.txt)."""

    def fire(self, key: str, times: int = 1, same: bool = False) -> list[Delivery | Exception]:
        """Approve `key` from `times` threads at the same instant: with `same`, one signed
        delivery sent `times` times (a sender's retry, a captured request replayed); else each
        signed apart (two buttons pressed).

        Returns each delivery's answer, or the exception it raised.
        """
        with self.lock:
            self.calls += times
            note = f"chaos harness approval {self.calls}"
        signed = self.webhook.request(key, note)
        deliveries = [
            signed if same or i == 0 else self.webhook.request(key, f"{note}.{i}")
            for i in range(times)
        ]
        barrier = threading.Barrier(times)
        results: list[Delivery | Exception] = [WebhookUnavailable("not sent")] * times

        def call(i: int) -> None:
            barrier.wait()
            try:
                results[i] = self.webhook.send(*deliveries[i])
            except Exception as exc:  # reported, not raised: the harness keeps going
                results[i] = exc

        threads = [threading.Thread(target=call, args=(i,)) for i in range(times)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._count(key, times, same, results)
        return results

    def _count(self, key: str, times: int, same: bool, results: list[Delivery | Exception]) -> None:
        now = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        accepted = 0
        with self.lock:
            self.concurrent += times > 1
            for result in results:
                if isinstance(result, Exception):
                    outcome = f"{type(result).__name__}: {str(result).splitlines()[0][:200]}"
                    self.errors.append(f"{key}: {outcome}")
                elif result.replay:
                    self.replays_refused += 1
                    outcome = "refused as a replay"
                else:
                    accepted += 1
                    self.firsts[key] += result.first
                    outcome = f"first={result.first} state={result.state}"
                self.log.append(f"{now} {key} x{times}{' same' if same else ''}: {outcome}")
            self.replays_accepted += same and accepted > 1

    def doubled(self) -> list[str]:
        """Actions approved as the first decision more than once: single use was broken."""
        with self.lock:
            return sorted(key for key, count in self.firsts.items() if count > 1)
