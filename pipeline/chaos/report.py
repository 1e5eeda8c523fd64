"""What a chaos run proved: every run and side effect checked from the database, the sandbox
delivery logs and the worker logs, as numbers for people (text) and for programs (JSON)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from models import RunStatus
from pipeline.chaos.cluster import LEASE_SECONDS
from pipeline.chaos.common import retrying
from pipeline.chaos.faults import describe, registered
from pipeline.chaos.poison import POISON as POISON_AGENT
from pipeline.db import transaction
from pipeline.engine.actions import ABSORBED
from pipeline.sandbox import read_log

if TYPE_CHECKING:
    from pipeline.chaos.approvals import Approvals
    from pipeline.chaos.cluster import Cluster
    from pipeline.chaos.faults import Fault
    from pipeline.chaos.harness import ChaosConfig, Sampler
    from pipeline.chaos.injector import Injector
    from pipeline.chaos.workload import Workload

STALE_WRITE_PATTERNS = {
    "lease_lost": "stopping without writing",
    "status_changed": "status changed under",
    "idle_in_transaction_killed": "idle-in-transaction",
}
"""Worker log lines that show a write refused because another worker had taken the run over
(LeaseLost), or PostgreSQL ending the session of a worker frozen in the middle of a send."""
DUPLICATE_MESSAGES_PATTERN = "not claimable"


@dataclass
class ChaosReport:
    seed: int
    duration: float
    workers: int
    hosts: int
    """Worker hosts (network namespaces) the workers ran on; 0: this machine's network."""
    schedule: str
    planned: int
    faults: dict[str, int]
    """Injected faults by kind."""
    skipped: dict[str, int]
    runs: dict[str, int]
    """The workload's runs by final status."""
    runs_by_agent: dict[str, dict[str, int]]
    resolved_by_person: int
    """Runs in needs_attention that the harness, as the person, resolved from the sandbox logs."""
    completion_rate: float | None
    interrupted: int
    """Runs a fault took away from their worker (killed, frozen, or in flight during a restart)."""
    interrupted_completed: int
    resumption_rate: float | None
    resume_seconds: dict[str, float | int]
    resume_by_kind: dict[str, dict[str, float | int]]
    side_effects: int
    duplicates: int
    duplicate_rate: float | None
    resends_absorbed: int
    """Actions sent more than once with the same key (the service's key made them one)."""
    duplicates_absorbed: int
    """Actions whose service said it already had the key (resolution `replayed_by_service` or
    `lookup`): what /metrics counts in nightshift_duplicates_absorbed_total."""
    stale_writes: dict[str, int]
    duplicate_messages_refused: int
    approvals: dict[str, int]
    workers_replaced: int
    poison: dict[str, int]
    """The poison agent's runs by status and reason, and the workers they killed."""
    restarts: dict[str, list[float]]
    settle_seconds: float
    logs: str
    model_waits: dict[str, float | int] = field(default_factory=dict)
    """Runs that waited on the model provider (a model_outage fault): seconds each waited."""
    model_unavailable: int = 0
    """Runs that failed model_unavailable: an outage of tens of seconds must be waited out."""
    duplicate_keys: list[str] = field(default_factory=list)
    missing_effects: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    waiting_for_person: list[str] = field(default_factory=list)
    still_waiting: list[str] = field(default_factory=list)
    """Runs legitimately waiting at the end: a timer not due yet, a decision not made."""
    failed_runs: list[str] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    exit_reasons: dict[str, int] = field(default_factory=dict)
    """Workers and beat that exited without being killed, by the reason in their log."""
    fault_notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "text": self.text()}

    def text(self) -> str:
        total = sum(self.faults.values())
        kinds = [f"{k} {self.faults.get(k, 0)}" for k in registered()]
        tallies: dict[str, int] = {}
        for name, kind in registered().items():
            if kind.tally:
                tallies[kind.tally] = tallies.get(kind.tally, 0) + self.faults.get(name, 0)
        skipped = sum(self.skipped.values())
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(self.runs.items()))
        stale = ", ".join(f"{k} {v}" for k, v in self.stale_writes.items())
        resume = self.resume_seconds
        lines = [
            f"== nightshift chaos: seed {self.seed}, {self.duration:.0f}s, {self.workers} "
            f"workers on {self.hosts or 'no'} worker hosts, schedule {self.schedule} ==",
            f"faults injected      {total} of {self.planned} planned: {'  '.join(kinds[:6])}"
            + (f"  (skipped {skipped})" if skipped else ""),
            f"                     {'  '.join(kinds[6:])}",
            "  of which           " + ", ".join(f"{n} {what}" for what, n in tallies.items()),
            f"runs                 {sum(self.runs.values())}: {statuses}",
            "  by agent           "
            + ", ".join(f"{a} {sum(n.values())}" for a, n in sorted(self.runs_by_agent.items())),
            f"completion rate      {_pct(self.completion_rate)}",
            f"resumption rate      {_pct(self.resumption_rate)} ({self.interrupted_completed} of "
            f"{self.interrupted} interrupted runs completed)",
            f"time to resume       p50 {resume['p50']}s  p95 {resume['p95']}s  max "
            f"{resume['max']}s  (n={resume['n']}, lease {LEASE_SECONDS}s)",
            *(
                f"  after {kind:<16} p50 {r['p50']}s  p95 {r['p95']}s  max {r['max']}s (n={r['n']})"
                for kind, r in self.resume_by_kind.items()
                if r["n"]
            ),
            f"model waits          {self.model_waits.get('n', 0)} runs waited on the model: "
            f"p50 {self.model_waits.get('p50', 0)}s  p95 {self.model_waits.get('p95', 0)}s  max "
            f"{self.model_waits.get('max', 0)}s; {self.model_unavailable} failed model_unavailable",
            f"side effects         {self.side_effects} delivered, {self.duplicates} duplicates: "
            f"duplicate-action rate {_pct(self.duplicate_rate)}; {self.resends_absorbed} resends "
            f"with the same key absorbed by the services, {self.duplicates_absorbed} of them "
            "answered as already done (nightshift_duplicates_absorbed_total)",
            f"stale writes refused {sum(self.stale_writes.values())} ({stale}); duplicate step "
            f"messages refused by the claim: {self.duplicate_messages_refused}",
            f"approvals            {self.approvals['calls']} signed webhook deliveries, "
            f"{self.approvals['concurrent']} fired twice at once, "
            f"{self.approvals['doubled']} approved twice, {self.approvals['replays_refused']} "
            f"refused as replays ({self.approvals['replays_accepted']} replays accepted), "
            f"{self.approvals['errors']} failed (service restarting)",
            f"workers              {self.workers_replaced} replaced, "
            f"{len(self.unexpected_exits)} exited without being killed; "
            f"{self.resolved_by_person} unknown outcomes resolved as a person",
            f"poison runs          {self.poison.get('runs', 0)}: "
            f"{self.poison.get('failed crashed_worker', 0)} failed crashed_worker, "
            f"{self.poison.get('runs', 0) - self.poison.get('failed crashed_worker', 0)} "
            f"otherwise; {self.poison.get('workers_killed', 0)} workers killed by them",
            f"restarts             redis {len(self.restarts.get('redis', []))}, postgres "
            f"{len(self.restarts.get('postgres', []))}; settled in {self.settle_seconds:.0f}s",
        ]
        for title, items in (
            ("lost runs", self.lost),
            ("stuck runs", self.stuck),
            ("duplicate side effects", self.duplicate_keys),
            ("confirmed but never delivered", self.missing_effects),
            ("waiting for a person", self.waiting_for_person),
            ("waiting legitimately", self.still_waiting),
            ("failed runs", self.failed_runs),
            ("exits by reason", [f"{n} x {why}" for why, n in self.exit_reasons.items()]),
            ("fault notes", self.fault_notes),
        ):
            if items:
                lines.append(f"{title} ({len(items)}):")
                lines += [f"  {item}" for item in items[:10]]
                lines += [f"  ... and {len(items) - 10} more"] if len(items) > 10 else []
        lines.append(f"logs                 {self.logs}")
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.problems)
        lines.append(f"result               {verdict}")
        return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}%"


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _summary(values: list[float]) -> dict[str, float | int]:
    return {
        "p50": round(percentile(values, 50), 2),
        "p95": round(percentile(values, 95), 2),
        "max": round(max(values, default=0.0), 2),
        "n": len(values),
    }


# -- the side effects, from the sandbox delivery logs ---------------------------------------


def deliveries(cluster: Cluster) -> Counter[str]:
    """Side effects delivered, per idempotency key (pull requests per the patch agent's key,
    `patch:<repo>:<branch>`)."""
    logs = cluster.logs / "sandbox"
    counts: Counter[str] = Counter()
    for entry in read_log(logs / "email.jsonl") + read_log(logs / "pricing.jsonl"):
        counts[f"{entry['service']}:{entry.get('key')}"] += 1
    for entry in read_log(logs / "githost.jsonl"):
        if entry.get("action") == "opened":
            counts[f"githost:patch:{entry['repo']}:{entry['branch']}"] += 1
    return counts


def _actions() -> list[Any]:
    query = text("SELECT idempotency_key, service, state, attempts, resolution FROM actions")
    with transaction() as session:
        return list(session.execute(query))


def _runs() -> list[Any]:
    query = text(
        "SELECT r.id, r.agent, r.status, r.stop_reason, r.error, r.waiting_on, r.batch_id,"
        " r.idempotency_key,"
        " r.wake_at > now() AS timer_ahead, a.state AS action_state"
        " FROM runs r LEFT JOIN actions a"
        "   ON r.waiting_on IN ('approval:' || a.idempotency_key, 'action:' || a.idempotency_key)"
    )
    with transaction() as session:
        return list(session.execute(query))


# Each wait on the model: from the status event that parked the run to its next status event
# (woken, or ended), or until now for a run still waiting.
_MODEL_WAITS = text(
    """
    SELECT run_id, sum(extract(epoch FROM coalesce(until, now()) - created_at)) AS seconds
      FROM (SELECT run_id, created_at, data->>'waiting_on' AS waiting_on,
                   lead(created_at) OVER (PARTITION BY run_id ORDER BY id) AS until
              FROM run_events WHERE kind = 'status') AS changes
     WHERE waiting_on LIKE 'model:%'
     GROUP BY run_id
    """
)


def _model_waits() -> dict[Any, float]:
    with transaction() as session:
        return {row.run_id: float(row.seconds) for row in session.execute(_MODEL_WAITS)}


def _scan_worker_logs(cluster: Cluster) -> tuple[dict[str, int], int]:
    stale = dict.fromkeys(STALE_WRITE_PATTERNS, 0)
    refused = 0
    for path in cluster.worker_logs():
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("["):
                continue  # a traceback's lines repeat the message of the record above them
            for name, pattern in STALE_WRITE_PATTERNS.items():
                stale[name] += pattern in line
            refused += DUPLICATE_MESSAGES_PATTERN in line
    return stale, refused


# -- the verdict ----------------------------------------------------------------------------


def verify(
    *,
    config: ChaosConfig,
    plan: list[Fault],
    digest: str,
    cluster: Cluster,
    workload: Workload,
    sampler: Sampler,
    injector: Injector,
    approvals: Approvals,
    settled: float,
) -> ChaosReport:
    runs = {
        row.id: row
        for row in retrying(_runs)
        if workload.owns(row.id, row.batch_id, row.idempotency_key)
    }
    statuses = Counter(str(row.status) for row in runs.values())
    succeeded = {run for run, row in runs.items() if row.status == "succeeded"}
    # A poison run is meant to kill its workers until it fails crashed_worker (checked below,
    # with its own line): it is not an interrupted run that should have resumed.
    poisoned = {run for run, row in runs.items() if row.agent == POISON}
    interrupted = (sampler.interrupted & set(runs)) - poisoned
    delivered = deliveries(cluster)
    actions = retrying(_actions)
    stale, refused = _scan_worker_logs(cluster)
    resumes = [seconds for _, seconds in sampler.resumed]
    report = ChaosReport(
        seed=config.seed,
        duration=config.duration,
        workers=config.workers,
        hosts=config.hosts,
        schedule=digest,
        planned=len(plan),
        faults=dict(Counter(r.fault.kind for r in injector.records if r.injected)),
        skipped=dict(Counter(r.fault.kind for r in injector.records if not r.injected)),
        runs=dict(statuses),
        runs_by_agent=_by_agent(runs.values()),
        resolved_by_person=workload.resolved_by_person,
        completion_rate=len(succeeded) / len(runs) if runs else None,
        interrupted=len(interrupted),
        interrupted_completed=len(interrupted & succeeded),
        resumption_rate=len(interrupted & succeeded) / len(interrupted) if interrupted else None,
        resume_seconds=_summary(resumes),
        resume_by_kind={
            kind: _summary([s for k, s in sampler.resumed if k == kind])
            for kind, what in registered().items()
            if what.interrupts
        },
        side_effects=sum(delivered.values()),
        duplicates=sum(n - 1 for n in delivered.values() if n > 1),
        duplicate_rate=(
            sum(n - 1 for n in delivered.values() if n > 1) / sum(delivered.values())
            if delivered
            else None
        ),
        resends_absorbed=sum(1 for a in actions if a.attempts > 1),
        duplicates_absorbed=sum(1 for a in actions if a.resolution in ABSORBED),
        stale_writes=stale,
        duplicate_messages_refused=refused,
        approvals={
            "calls": approvals.calls,
            "concurrent": approvals.concurrent,
            "doubled": len(approvals.doubled()),
            "replays_refused": approvals.replays_refused,
            "replays_accepted": approvals.replays_accepted,
            "errors": len(approvals.errors),
        },
        workers_replaced=cluster.replaced,
        poison=_poison(runs.values(), cluster.poison_kills),
        restarts=cluster.restarts,
        settle_seconds=round(settled, 1),
        logs=str(cluster.logs),
        duplicate_keys=[f"{key} delivered {n} times" for key, n in delivered.items() if n > 1],
        missing_effects=[
            f"{a.service}:{a.idempotency_key} ({a.resolution or 'first send'})"
            for a in actions
            if a.state == "confirmed" and not delivered.get(_delivery_key(a))
        ],
        unexpected_exits=[
            f"{d.name} at +{d.at}s (exit {d.code}): {d.reason}" for d in cluster.deaths
        ],
        exit_reasons=dict(Counter(d.reason for d in cluster.deaths).most_common()),
        fault_notes=[f"{describe(r.fault)}: {r.note}" for r in injector.records if not r.injected]
        + [f"harness: {error}" for error in workload.errors[:20]],
    )
    waits = retrying(_model_waits)
    report.model_waits = _summary([seconds for run, seconds in waits.items() if run in runs])
    report.model_unavailable = sum(
        1 for row in runs.values() if row.stop_reason == "model_unavailable"
    )
    _classify(report, runs, sampler)
    report.problems = _problems(report, workload, approvals)
    return report


def _by_agent(rows: Iterable[Any]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = {}
    for row in rows:
        counts.setdefault(row.agent, Counter())[str(row.status)] += 1
    return {agent: dict(statuses) for agent, statuses in counts.items()}


POISON = POISON_AGENT.name


def _poison(rows: Iterable[Any], workers_killed: int) -> dict[str, int]:
    ends = Counter(f"{row.status} {row.stop_reason}" for row in rows if row.agent == POISON)
    return {"runs": sum(ends.values()), **ends, "workers_killed": workers_killed}


def _delivery_key(action: Any) -> str:
    return f"{action.service}:{action.idempotency_key}"


def _classify(report: ChaosReport, runs: dict[Any, Any], sampler: Sampler) -> None:
    """Every unfinished run is waiting legitimately (a timer ahead, an undecided approval, a
    person), stuck (running, not finishing) or lost (waiting on something that will not come)."""
    still = set(sampler.still(LEASE_SECONDS * 10))
    for run_id, row in sorted(runs.items(), key=lambda item: str(item[0])):
        status, what = str(row.status), f"{run_id} {row.agent}"
        if status == "failed":
            report.failed_runs.append(f"{what}: {row.stop_reason}: {(row.error or '')[:160]}")
        elif status == "needs_attention":
            report.waiting_for_person.append(f"{what} on {row.waiting_on}")
        elif status == "running":
            moving = "no progress" if run_id in still else "still moving"
            report.stuck.append(f"{what}: running at the end ({moving})")
        elif status == "waiting":
            # A wait on the model has its give-up time (hours ahead) as its timer.
            on_model = (row.waiting_on or "").startswith("model:")
            if (row.timer_ahead and not on_model) or row.action_state == "pending_approval":
                why = "timer ahead" if row.timer_ahead else "approval pending"
                report.still_waiting.append(f"{what}: {why} on {row.waiting_on}")
                continue
            report.lost.append(f"{what}: waiting on {row.waiting_on} ({row.action_state})")


def _problems(report: ChaosReport, workload: Workload, approvals: Approvals) -> list[str]:
    problems = []
    if report.duplicates:
        problems.append(f"{report.duplicates} side effect(s) happened twice")
    if report.missing_effects:
        problems.append(f"{len(report.missing_effects)} confirmed effect(s) never delivered")
    never_started = len(workload.unstarted)
    if report.lost or never_started:
        problems.append(f"{len(report.lost) + never_started} run(s) lost")
    if report.stuck:
        problems.append(f"{len(report.stuck)} run(s) stuck")
    if report.model_unavailable:
        problems.append(f"{report.model_unavailable} run(s) failed model_unavailable")
    if approvals.doubled():
        problems.append(f"{len(approvals.doubled())} approval(s) took effect twice")
    if approvals.replays_accepted:
        problems.append(f"{approvals.replays_accepted} replayed webhook delivery(ies) accepted")
    if report.unexpected_exits:
        problems.append(f"{len(report.unexpected_exits)} worker or beat exit(s) nobody caused")
    # A poison run still going is stuck (above); one that ended must have failed crashed_worker.
    ended = {f"{s} " for s in RunStatus.terminal()}
    wrong = sum(n for end, n in report.poison.items() if end[: end.find(" ") + 1] in ended
                and end != "failed crashed_worker")  # fmt: skip
    if wrong:
        problems.append(f"{wrong} poison run(s) ended otherwise than failed crashed_worker")
    return problems
