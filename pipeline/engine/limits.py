"""What stops a run before its next model or tool call: cancellation, the deadline, the night's
and the batch's budgets, the run's own tool-call, token and money limits. A stop that trips a
budget raises one alert; nearing the nightly cap raises a warning first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from models import BatchStatus
from pipeline.agent_definition import Agent
from pipeline.engine import budgets
from pipeline.engine.leases import Lease, fenced
from pipeline.errors import NotConfigured, RunStopped
from pipeline.settings import Settings


@dataclass(frozen=True)
class Limits:
    """What the stop checks read, as of one transaction."""

    cancel_requested: bool
    cancelled_by: str | None
    past_deadline: bool
    spend: budgets.Spend


def limits_of(values: Mapping[str, Any]) -> Limits:
    """The limits as schema.sql's nightshift_limits reads them."""
    spend = budgets.spend_of(values)
    return Limits(
        values["cancel_requested"], values["cancel_requested_by"], values["past_deadline"], spend
    )


def stop_for(
    limits: Limits,
    agent: Agent | None,
    settings: Settings,
    calls_in_step: int,
    before_tool: bool,
) -> RunStopped | None:
    """The first reason this run must stop before its next call, if any."""
    spend = limits.spend
    if limits.cancel_requested:
        return RunStopped("cancelled", f"cancelled by {limits.cancelled_by}")
    if limits.past_deadline:
        return RunStopped("deadline", "the run's deadline passed")
    if spend.batch_status is BatchStatus.STOPPED:
        reason = spend.batch_stop_reason or budgets.BATCH_STOPPED
        return RunStopped(reason, f"batch {spend.batch_id} was stopped ({reason})")
    over = budgets.night_over_budget(spend, settings)
    if over is not None:
        return RunStopped(budgets.NIGHT_STOPPED, over)
    over = budgets.batch_over_budget(spend, calls_in_step, before_tool)
    if over is not None:
        return RunStopped(budgets.BATCH_STOPPED, over)
    if agent is None:
        return None
    calls = spend.tool_calls + calls_in_step
    if before_tool and agent.max_tool_calls is not None and calls >= agent.max_tool_calls:
        return RunStopped(
            "max_tool_calls", f"{calls} tool calls; the limit is {agent.max_tool_calls}"
        )
    if agent.max_run_tokens is not None and spend.tokens >= agent.max_run_tokens:
        return RunStopped(
            "max_tokens", f"{spend.tokens} tokens; the limit is {agent.max_run_tokens}"
        )
    cap = agent.max_run_cost_usd
    if cap is not None and spend.cost_usd >= cap:
        return RunStopped("max_cost", f"cost ${spend.cost_usd:.4f}; the limit is ${cap:.4f}")
    return None


def config_stop(agent: Agent, settings: Settings) -> RunStopped | None:
    """The run cannot work on this worker: a tool needs a variable that is not set here."""
    unset = agent.unset_needs(settings.is_set)
    if not unset:
        return None
    variables = tuple(dict.fromkeys(variable for variable, _ in unset))
    tools = ", ".join(dict.fromkeys(tool for _, tool in unset))
    return NotConfigured(variables, f"agent {agent.name!r} ({tools})").stop()


def alert_for(stop: RunStopped, spend: budgets.Spend, lease: Lease, settings: Settings) -> None:
    """Record (once) what a budget stop means: the batch stops, or the run's limit alert, and
    the alert's webhook owed. Fenced like every write of a step: a step whose lease is gone
    stops no batch, fails no parked run and raises no alert (LeaseLost, and the transaction
    rolls back)."""
    with fenced(lease) as session:
        if stop.reason == budgets.NIGHT_STOPPED and spend.night is not None:
            budgets.stop_night_txn(session, settings, spend.night, str(stop))
        elif stop.reason == budgets.BATCH_STOPPED and spend.batch_status is BatchStatus.RUNNING:
            assert spend.batch_id is not None
            budgets.stop_batch_txn(
                session, settings, spend.batch_id, budgets.BATCH_STOPPED, str(stop)
            )
        elif stop.reason.startswith("max_"):
            budgets.raise_alert_txn(
                session, settings, f"budget_{stop.reason}", f"run:{lease.run_id}", str(stop)
            )


def warn_for(limits: Limits, lease: Lease, settings: Settings) -> None:
    """Raise the night's warning alert once, when its spend nears the nightly cap (fenced)."""
    spend = limits.spend
    message = budgets.night_warning(spend, settings)
    if message is None or spend.night is None:
        return
    with fenced(lease) as session:
        budgets.raise_alert_txn(
            session, settings, budgets.NIGHT_WARNING, spend.night.subject, message
        )
