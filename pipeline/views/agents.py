"""The registered agents as a person or a program reads them: where each comes from, its
prompt version, its tools (side effects, approvals) and the input it accepts."""

from __future__ import annotations

from typing import Any

from pipeline.agent_definition import Agent, default_job
from pipeline.registry import Registered, registry
from pipeline.settings import Settings, get_settings
from pipeline.tools import Tool


def describe_agents(settings: Settings | None = None) -> list[dict[str, Any]]:
    """Every agent this process has registered, by name."""
    settings = settings or get_settings()
    agents = registry().agents
    return [_describe(agents[name], settings) for name in sorted(agents)]


def _describe(registered: Registered, settings: Settings) -> dict[str, Any]:
    agent = registered.agent
    return {
        "name": agent.name,
        "package": registered.package,
        "registered_by": registered.source,
        "path": registered.path,
        "prompt_version": agent.prompt_version,
        "model": _model(agent, settings),
        "max_steps": agent.max_steps,
        "tools": [_tool(t, settings) for t in agent.tools],
        "input_schema": agent.input_schema,
        "schedule_job": "one run with the schedule's params"
        if agent.job is default_job
        else (agent.job.__doc__ or agent.job.__name__).strip().splitlines()[0],
        "event_sources": [source.name for source in agent.event_sources],
    }


def _model(agent: Agent, settings: Settings) -> str:
    if settings.anthropic_api_key:
        return f"{settings.model_name} (ANTHROPIC_API_KEY is set)"
    if agent.script is None:
        return "real model only; not startable here: ANTHROPIC_API_KEY is not set"
    return "its script (ANTHROPIC_API_KEY is not set)"


def _tool(tool: Tool, settings: Settings) -> dict[str, Any]:
    described: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description,
        "typed": tool.typed,
        "timer": tool.wake_time is not None,
        "side_effect": None,
        "requires_approval": tool.requires_approval,
        "approvers": list(tool.approvers),
        "needs": list(tool.needs),
        "needs_unset": [name for name in tool.needs if not settings.is_set(name)],
    }
    effect = tool.side_effect
    if effect is not None:
        retention = effect.retention(settings)
        described["side_effect"] = {
            "service": effect.service,
            "namespace": effect.namespace,
            "honours_keys": effect.honoured(settings),
            "key_retention_seconds": None if retention is None else retention.total_seconds(),
            "lookup": effect.lookup is not None,
        }
    return described
