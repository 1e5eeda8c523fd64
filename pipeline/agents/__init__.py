"""The shipped agents, by name."""

from __future__ import annotations

from functools import cache

from pipeline.agents.base import Agent
from pipeline.errors import UnknownAgent


@cache
def _registry() -> dict[str, Agent]:
    from pipeline.agents import (
        bench_agent,
        competitor_monitor,
        follow_up,
        invoice_reminders,
        nightly_report,
        patch,
        price_synthesis,
    )

    shipped = (
        nightly_report.AGENT,
        patch.AGENT,
        follow_up.AGENT,
        bench_agent.AGENT,
        competitor_monitor.AGENT,
        price_synthesis.AGENT,
        invoice_reminders.AGENT,
    )
    return {agent.name: agent for agent in shipped}


def get_agent(name: str) -> Agent:
    agents = _registry()
    try:
        return agents[name]
    except KeyError:
        known = ", ".join(sorted(agents))
        raise UnknownAgent(f"unknown agent {name!r}; known agents: {known}") from None


def agent_names() -> list[str]:
    return sorted(_registry())


def all_agents() -> list[Agent]:
    return list(_registry().values())
