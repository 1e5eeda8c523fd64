"""The chaos harness's workload: runs of every shipped agent started at seeded random times
(the first one a poison run, alone), and approvals granted later through the signed webhook
(some at once, some twice at the same instant, signed apart like two buttons pressed)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from models import Run
from pipeline.chaos.approvals import Approvals, pending_approvals
from pipeline.chaos.common import TRANSIENT, retrying
from pipeline.chaos.poison import POISON
from pipeline.db import transaction
from pipeline.keys import batch_of_synthesis
from pipeline.registry import agent_names
from pipeline.runs.fanout import BatchPlan, create_batch_txn
from pipeline.runs.start import start_run
from pipeline.sandbox.web import competitors

if TYPE_CHECKING:
    from pipeline.agent_definition import BatchPlan
    from pipeline.chaos.harness import Sampler

MAX_ACTIVE = 40
"""No new run while this many are running or waiting: faults should slow runs, not a backlog."""
TODAY = date.today()


@dataclass(frozen=True)
class Job:
    """One kind of work the workload starts: a run, or a batch (children and a synthesis)."""

    agent: str
    weight: float
    make_input: Callable[[int, random.Random], dict[str, Any]] | None = None
    make_batch: Callable[[str, random.Random], BatchPlan] | None = None
    needs: tuple[str, ...] = ()
    """Other agents the job needs registered (a batch's synthesis agent)."""


def _nightly_report(n: int, rng: random.Random) -> dict[str, Any]:
    # A team of its own per run, so each run has its own email key nightly_report:<date>:<team>.
    return {"team": f"team-{n:05d}", "date": TODAY.isoformat()}


def _patch(n: int, rng: random.Random) -> dict[str, Any]:
    # One branch per run (patch/issue-<n>): one pull request each.
    return {"issue": n, "repo": "acme/shop", "title": f"Totals off by a cent ({n})"}


def _follow_up(n: int, rng: random.Random) -> dict[str, Any]:
    return {"after_seconds": rng.randint(2, 8)}


def _invoice_reminders(n: int, rng: random.Random) -> dict[str, Any]:
    # A week of its own per run: reminder keys are invoice-reminder:<client>:<ISO week>.
    return {"date": (TODAY + timedelta(weeks=n)).isoformat()}


def _competitor_batch(batch_id: str, rng: random.Random) -> BatchPlan:
    chosen = sorted(rng.sample(competitors(), rng.randint(3, 5)), key=lambda c: c["id"])
    children = [{"competitor": c["id"], "name": c["name"], "batch": batch_id} for c in chosen]
    return BatchPlan(
        batch_id=batch_id,
        name="competitor_monitor",
        child_agent="competitor_monitor",
        child_inputs=children,
        synthesis_agent="price_synthesis",
        params={"chaos": True},
    )


# Extension point: an agent joins the workload with a Job here. Jobs whose agents are not
# registered are left out, so agents still being written can be listed before they ship.
JOBS: tuple[Job, ...] = (
    Job("nightly_report", 5, _nightly_report),
    Job("patch", 3, _patch),
    Job("follow_up", 2, _follow_up),
    Job("invoice_reminders", 0.5, _invoice_reminders),
    Job("competitor_monitor", 0.5, make_batch=_competitor_batch, needs=("price_synthesis",)),
    # Rare: each of its runs kills a worker max_step_attempts times before it fails.
    Job(POISON.name, 0.1, lambda n, rng: {"n": n}),
)
FIRST_JOB = POISON.name
"""The workload's first run is a poison run (when the agent is registered, as the harness
does): at weight 0.1 a short run might have none, and its kills and its crashed_worker end are
what the report checks."""
FIRST_ALONE_SECONDS = 45.0
"""Nothing else starts until that first run has ended (at most this long): its kills take no
neighbour with them, so the injected faults cannot add up with them to fail an innocent run
whatever the timing. Neighbours of a poison run are test_poison_runs' subject; the workload's
later poison runs still meet them at random."""


class Workload:
    """Starts runs at seeded random intervals; approves every pending approval after a seeded
    delay (a quarter at once, like a bot; three in ten twice at the same instant)."""

    def __init__(
        self, seed: int, clock: Callable[[], float], sampler: Sampler, approvals: Approvals
    ) -> None:
        self.rng = random.Random(f"{seed}:workload")
        self.seed = seed
        self.clock = clock
        self.sampler = sampler
        self.approvals = approvals
        known = set(agent_names())
        self.jobs = [j for j in JOBS if {j.agent, *j.needs} <= known]
        self.runs: set[uuid.UUID] = set()
        self.batches: set[str] = set()
        self.unstarted: list[tuple[str, Job]] = []
        self.approve_at: dict[str, float] = {}
        self.approved: set[str] = set()
        self.count = 0
        self.first: uuid.UUID | None = None
        """The first run, while nothing else may start (FIRST_ALONE_SECONDS)."""
        self.alone_until = 0.0
        self.resolved_by_person = 0
        self.next_start = self.next_scan = 0.0
        self.starting = True
        self.stopping = threading.Event()
        self.errors: list[str] = []
        """The harness's own failures (not the runtime's), reported at the end."""

    @property
    def agents(self) -> list[str]:
        return [job.agent for job in self.jobs]

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            try:
                self.step()
            except TRANSIENT:
                time.sleep(0.25)
            except Exception as exc:  # keep the workload going; the report lists what broke
                self.errors.append(f"+{self.clock():.1f}s {type(exc).__name__}: {exc}"[:300])
                time.sleep(0.5)

    def step(self) -> None:
        now = self.clock()
        if now >= self.next_scan and self.first is not None:
            self._forget_first_once_ended(now)
        if (
            self.starting
            and now >= self.next_start
            and self.first is None
            and self.sampler.active_count() < MAX_ACTIVE
        ):
            self.next_start = now + self.rng.uniform(0.3, 1.5)
            self.count += 1
            job = self.rng.choices(self.jobs, [j.weight for j in self.jobs])[0]
            if self.count == 1:  # drawn all the same: the seed's later choices do not move
                job = next((j for j in self.jobs if j.agent == FIRST_JOB), job)
            self.unstarted.append((f"chaos-{self.seed}-{self.count}", job))
        while self.unstarted:
            self._start(*self.unstarted[0])
            self.unstarted.pop(0)
        if now >= self.next_scan:
            self.next_scan = now + 0.5
            self._approve_due(now)

    def _start(self, key: str, job: Job) -> None:
        n = int(key.rsplit("-", 1)[1])
        if job.make_batch is not None:
            self._start_batch(job.make_batch(key, random.Random(key)))
            return
        assert job.make_input is not None
        # The key makes a retry after an error safe: it returns the run the first try made.
        started = start_run(job.agent, job.make_input(n, random.Random(key)), idempotency_key=key)
        self.runs.add(started.run_id)
        if n == 1 and job.agent == FIRST_JOB:
            self.first, self.alone_until = started.run_id, self.clock() + FIRST_ALONE_SECONDS

    def _forget_first_once_ended(self, now: float) -> None:
        """Let other runs start once the first run has ended, or it had its time alone."""
        with transaction() as session:
            status = session.scalar(select(Run.status).where(Run.id == self.first))
        if now >= self.alone_until or (status is not None and status.is_terminal()):
            self.first = None

    def _start_batch(self, plan: BatchPlan) -> None:
        # The children start after the commit; one whose message is lost is found by the tick.
        with transaction() as session:
            create_batch_txn(session, plan)
        self.batches.add(plan.batch_id)

    def _approve_due(self, now: float) -> None:
        for key in pending_approvals():
            if key not in self.approve_at:
                eager = self.rng.random() < 0.25
                self.approve_at[key] = now + (0.0 if eager else self.rng.uniform(3, 20))
        for key, due in sorted(self.approve_at.items()):
            if due <= now and key not in self.approved:
                results = self.approvals.fire(key, 2 if self.rng.random() < 0.3 else 1)
                if any(isinstance(r, TRANSIENT) for r in results):
                    self.approve_at[key] = now + 1.0
                else:
                    self.approved.add(key)

    def approve_all(self) -> int:
        """Settling: approve every approval still pending, at once."""
        pending = retrying(pending_approvals)
        for key in pending:
            self.approvals.fire(key)
        return len(pending)

    def owns(self, run_id: uuid.UUID, batch_id: str | None, key: str | None) -> bool:
        """Whether the workload started this run (itself, or through one of its batches)."""
        if run_id in self.runs or batch_id in self.batches:
            return True
        return key is not None and batch_of_synthesis(key) in self.batches
