"""Reliability and usage metrics, computed from the database (and the queue length from Redis).

What `nightshift metrics` and the chaos report print. These queries read every run kept; the
Prometheus scrape (`/metrics`) does not use them: it reads pipeline.instruments' counters and
the bounded gauges of pipeline.views.gauges.

The four reliability metrics, precisely:

- run completion ratio: succeeded / (succeeded + failed) over all runs in the database.
  Cancelled runs are left out (a person chose to stop them); unfinished runs are not counted.
- resumption success ratio: of the runs that were taken over at least once (a `resumptions`
  row with `resumed_at` set: their worker lost its lease, or their step message was lost, and
  another claim picked them up) and are finished now, the share that succeeded.
- duplicate-action ratio: possible duplicates / confirmed actions. A possible duplicate is a
  confirmed action that was sent more than once (`attempts > 1`) without a recorded reason
  that makes the resend safe: resent with the same key to a service that replays keys
  (`resent_with_key`; `replayed_by_service` when its answer said it already had the key),
  confirmed by asking the service (`lookup`), sent again after the service
  (`lookup_not_found`) or a person (`person_did_not_happen`) said it had not happened.
  The runtime always records one of those, so a non-zero value points at a bug or at a
  service that was wrongly declared to honour keys.
- time to resume: for each takeover, `resumed_at - lost_at`: from the moment the lost lease
  expired (or, for a lost message, the run's last write) to the claim that resumed the run.
  The lease itself (NIGHTSHIFT_LEASE_SECONDS) comes before this and is a setting, not a
  measurement. Reported as p50 and p95 over all takeovers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from models import Action, ActionKind, ActionState, Resumption, Run, RunStatus
from pipeline.db import broker_client, read_only
from pipeline.settings import Settings, get_settings

# Resends the action protocol made on purpose, each for a reason that makes it safe.
EXPLAINED_RESENDS = (
    "resent_with_key",
    "replayed_by_service",
    "lookup",
    "lookup_not_found",
    "person_did_not_happen",
)
QUANTILES = (0.5, 0.95)


@dataclass(frozen=True)
class Metrics:
    runs: dict[tuple[str, str], int]
    """(agent, status) -> runs."""
    steps: dict[str, int]
    input_tokens: dict[str, int]
    output_tokens: dict[str, int]
    actions: dict[str, int]
    """Action state -> actions."""
    confirmed_actions: int
    resent_actions: dict[str, int]
    """Confirmed actions sent more than once, by their recorded resolution ('none' if none)."""
    possible_duplicates: int
    resumed_runs: dict[str, int]
    """Status -> runs taken over at least once."""
    resumptions: int
    resumptions_open: int
    resume_seconds_sum: float
    resume_seconds: dict[float, float | None] = field(default_factory=dict)
    """Quantile -> seconds from losing the worker to the takeover claim."""
    version_changed_runs: dict[str, int] = field(default_factory=dict)
    """Agent -> runs whose last step ran under another agent version than they started under."""
    queue: str = ""
    queue_depth: int | None = None
    """Messages waiting in the broker queue; None when Redis could not be asked."""

    @property
    def completion_ratio(self) -> float | None:
        succeeded = self._runs_with(RunStatus.SUCCEEDED)
        return _ratio(succeeded, succeeded + self._runs_with(RunStatus.FAILED))

    @property
    def resumption_success_ratio(self) -> float | None:
        finished = sum(n for s, n in self.resumed_runs.items() if RunStatus(s).is_terminal())
        return _ratio(self.resumed_runs.get(RunStatus.SUCCEEDED, 0), finished)

    @property
    def duplicate_action_ratio(self) -> float | None:
        return _ratio(self.possible_duplicates, self.confirmed_actions)

    def _runs_with(self, status: RunStatus) -> int:
        return sum(n for (_, s), n in self.runs.items() if s == status)


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def collect(settings: Settings | None = None) -> Metrics:
    settings = settings or get_settings()
    with read_only() as session:
        metrics = collect_txn(session)
    return replace(metrics, queue=settings.queue, queue_depth=queue_depth(settings))


def collect_txn(session: Session) -> Metrics:
    runs: dict[tuple[str, str], int] = {}
    steps: dict[str, int] = {}
    tokens_in: dict[str, int] = {}
    tokens_out: dict[str, int] = {}
    by_agent = select(
        Run.agent,
        Run.status,
        func.count(),
        func.sum(Run.step),
        func.sum(Run.input_tokens),
        func.sum(Run.output_tokens),
    ).group_by(Run.agent, Run.status)
    for agent, status, count, step, t_in, t_out in session.execute(by_agent):
        runs[(agent, str(status))] = count
        steps[agent] = steps.get(agent, 0) + int(step)
        tokens_in[agent] = tokens_in.get(agent, 0) + int(t_in)
        tokens_out[agent] = tokens_out.get(agent, 0) + int(t_out)
    actions = {
        str(state): count
        for state, count in session.execute(
            select(Action.state, func.count())
            .where(Action.kind == ActionKind.TOOL)
            .group_by(Action.state)
        )
    }
    resent = {
        resolution or "none": count
        for resolution, count in session.execute(
            select(Action.resolution, func.count())
            .where(
                Action.state == ActionState.CONFIRMED,
                Action.attempts > 1,
                Action.kind == ActionKind.TOOL,
            )
            .group_by(Action.resolution)
        )
    }
    took_over = exists().where(Resumption.run_id == Run.id, Resumption.resumed_at.is_not(None))
    resumed_runs = {
        str(status): count
        for status, count in session.execute(
            select(Run.status, func.count()).where(took_over).group_by(Run.status)
        )
    }
    closed, open_, total, quantiles = _resumptions(session)
    changed = dict(
        session.execute(
            select(Run.agent, func.count())
            .where(Run.running_version != Run.agent_version)  # both recorded, and not equal
            .group_by(Run.agent)
        ).all()
    )
    return Metrics(
        runs=runs,
        steps=steps,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        actions=actions,
        confirmed_actions=actions.get(ActionState.CONFIRMED, 0),
        resent_actions=resent,
        possible_duplicates=sum(n for r, n in resent.items() if r not in EXPLAINED_RESENDS),
        resumed_runs=resumed_runs,
        resumptions=closed,
        resumptions_open=open_,
        resume_seconds_sum=total,
        resume_seconds=quantiles,
        version_changed_runs={str(agent): int(n) for agent, n in changed.items()},
    )


def _resumptions(session: Session) -> tuple[int, int, float, dict[float, float | None]]:
    seconds = func.extract("epoch", Resumption.resumed_at - Resumption.lost_at)
    row = session.execute(
        select(
            func.count(Resumption.resumed_at),
            func.count().filter(Resumption.resumed_at.is_(None)),
            func.coalesce(func.sum(seconds), 0),
            *(func.percentile_cont(q).within_group(seconds) for q in QUANTILES),
        )
    ).one()
    closed, open_, total, *values = row
    quantiles = {q: None if v is None else float(v) for q, v in zip(QUANTILES, values, strict=True)}
    return int(closed), int(open_), float(total), quantiles


def queue_depth(settings: Settings) -> int | None:
    """LLEN of the step queue; None (and no exception) when Redis cannot be reached."""
    lengths = queue_lengths(settings, [settings.queue])
    return None if lengths is None else lengths[settings.queue]


def queue_lengths(settings: Settings, queues: Sequence[str]) -> dict[str, int] | None:
    """LLEN of each queue in one round trip; None when Redis cannot be reached."""
    try:
        client = broker_client(settings, timeout=2)
        try:
            pipe = client.pipeline(transaction=False)
            for queue in queues:
                pipe.llen(queue)
            return {queue: int(n) for queue, n in zip(queues, pipe.execute(), strict=True)}
        finally:
            client.close()
    except redis.RedisError:
        return None


# -- output ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    name: str
    kind: str
    help: str
    samples: Sequence[tuple[dict[str, str], float | None]]
    """(labels, value); None for a ratio with nothing to divide."""
    total: tuple[float, int] | None = None
    """A summary's `_sum` and `_count`."""


def families(m: Metrics) -> list[Family]:
    agents = sorted(m.steps)
    resume = [({"quantile": str(q)}, v) for q, v in m.resume_seconds.items()]
    result = [
        Family("nightshift_run_completion_ratio", "gauge",
               "Succeeded / (succeeded + failed) runs; cancelled runs are left out.",
               [({}, m.completion_ratio)]),
        Family("nightshift_resumption_success_ratio", "gauge",
               "Of the finished runs that were taken over at least once, the share that "
               "succeeded.", [({}, m.resumption_success_ratio)]),
        Family("nightshift_duplicate_action_ratio", "gauge",
               "Confirmed actions sent more than once with no recorded safe reason / confirmed "
               "actions.", [({}, m.duplicate_action_ratio)]),
        Family("nightshift_time_to_resume_seconds", "summary",
               "From a lost lease's expiry (or a lost message's last write) to the takeover "
               "claim.", resume, total=(m.resume_seconds_sum, m.resumptions)),
        Family("nightshift_runs", "gauge", "Runs by agent and status.",
               [({"agent": a, "status": s}, n) for (a, s), n in sorted(m.runs.items())]),
        Family("nightshift_agent_steps_total", "counter", "Completed steps, by agent.",
               [({"agent": a}, m.steps[a]) for a in agents]),
        Family("nightshift_agent_tokens_total", "counter", "Model tokens, by agent and kind.",
               [({"agent": a, "kind": "input"}, m.input_tokens[a]) for a in agents]
               + [({"agent": a, "kind": "output"}, m.output_tokens[a]) for a in agents]),
        Family("nightshift_actions", "gauge", "Actions (side effects) by state.",
               [({"state": s}, m.actions.get(s, 0)) for s in ActionState]),
        Family("nightshift_pending_approvals", "gauge", "Actions waiting for a person's "
               "approval.", [({}, m.actions.get(ActionState.PENDING_APPROVAL, 0))]),
        Family("nightshift_actions_outcome_unknown", "gauge", "Actions whose outcome is "
               "unknown.", [({}, m.actions.get(ActionState.OUTCOME_UNKNOWN, 0))]),
        Family("nightshift_actions_resent", "gauge", "Confirmed actions sent more than once, "
               "by recorded resolution.",
               [({"resolution": r}, n) for r, n in sorted(m.resent_actions.items())]),
        Family("nightshift_resumed_runs", "gauge", "Runs taken over at least once, by status.",
               [({"status": s}, n) for s, n in sorted(m.resumed_runs.items())]),
        Family("nightshift_resumptions_open", "gauge", "Runs found without a live worker and "
               "not yet claimed again.", [({}, m.resumptions_open)]),
        Family("nightshift_runs_version_changed", "gauge", "Runs whose last step ran under "
               "another agent version than they started under, by agent.",
               [({"agent": a}, n) for a, n in sorted(m.version_changed_runs.items())]),
    ]  # fmt: skip
    if m.queue_depth is not None:
        result.append(
            Family(
                "nightshift_queue_depth",
                "gauge",
                "Step messages waiting in the broker.",
                [({"queue": m.queue}, m.queue_depth)],
            )
        )
    return result


def as_json(m: Metrics) -> dict[str, Any]:
    """The same numbers for programs (`nightshift metrics --json`)."""
    return {
        "run_completion_ratio": m.completion_ratio,
        "resumption_success_ratio": m.resumption_success_ratio,
        "duplicate_action_ratio": m.duplicate_action_ratio,
        "time_to_resume_seconds": {
            **{f"p{round(q * 100)}": v for q, v in m.resume_seconds.items()},
            "count": m.resumptions,
            "sum": m.resume_seconds_sum,
        },
        "runs": [{"agent": a, "status": s, "count": n} for (a, s), n in sorted(m.runs.items())],
        "steps": m.steps,
        "tokens": {a: {"input": m.input_tokens[a], "output": m.output_tokens[a]} for a in m.steps},
        "actions": m.actions,
        "pending_approvals": m.actions.get(ActionState.PENDING_APPROVAL, 0),
        "outcome_unknown": m.actions.get(ActionState.OUTCOME_UNKNOWN, 0),
        "confirmed_actions": m.confirmed_actions,
        "resent_actions": m.resent_actions,
        "possible_duplicates": m.possible_duplicates,
        "resumed_runs": m.resumed_runs,
        "resumptions_open": m.resumptions_open,
        "version_changed_runs": m.version_changed_runs,
        "queue": {"name": m.queue, "depth": m.queue_depth},
    }
