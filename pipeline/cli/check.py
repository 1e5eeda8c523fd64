"""`nightshift check`: what a deploy runs first. Every problem the deployment would otherwise
meet at night, one line each, and a non-zero exit when there is any: the agents register, every
schedule names a registered agent, every agent's tools have the settings they need, PostgreSQL
and Redis answer, and the schema is the one this release migrates to."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from alembic.script import ScriptDirectory

from pipeline.cli.failures import describe
from pipeline.cli.setting_hints import where_to_set
from pipeline.db import ping_broker, ping_database
from pipeline.errors import Misconfigured
from pipeline.migrate import alembic_config, current
from pipeline.registry import Registry, registry
from pipeline.runs.schedule_list import load_schedules
from pipeline.settings import get_settings

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand

TIMEOUT_SECONDS = 5
"""How long PostgreSQL and Redis each get to answer: a deploy should not hang on a dead host."""
PROBLEMS_EXIT = 1


def register(add: AddCommand) -> None:
    add(
        "check",
        cmd_check,
        "check the deployment before starting it: agents, schedules, the agents' settings, "
        "PostgreSQL, Redis and the schema; one line per problem, exit 1 if there is any",
    )


def cmd_check(args: argparse.Namespace) -> int:
    problems = list(deployment_problems())
    for problem in problems:
        print(f"problem: {problem}")
    if problems:
        print(f"{len(problems)} problem(s): fix them before starting nightshift")
        return PROBLEMS_EXIT
    agents = ", ".join(sorted(registry().agents)) or "none"
    print(f"ok: agents {agents}; schedules, settings, PostgreSQL, Redis and the schema")
    return 0


def deployment_problems() -> Iterator[str]:
    try:
        agents = registry()
    except Misconfigured as exc:
        yield f"agents: {exc}"
    else:
        yield from _schedule_problems(agents)
        yield from _setting_problems(agents)
    database = _probe(ping_database)
    if database is not None:
        yield f"PostgreSQL: {database}"
    else:
        yield from _schema_problems()
    broker = _probe(ping_broker)
    if broker is not None:
        yield f"Redis: {broker}"


def _schedule_problems(agents: Registry) -> Iterator[str]:
    try:
        schedules = load_schedules()
    except Misconfigured as exc:
        yield f"schedules: {exc}"
        return
    for schedule in schedules:
        if schedule.agent not in agents.agents:
            yield (
                f"schedules: {schedule.name!r} names agent {schedule.agent!r}, which is not "
                "registered: beat refuses to start"
            )


def _setting_problems(agents: Registry) -> Iterator[str]:
    """One line per setting that is missing, with every agent and tool that needs it."""
    settings = get_settings()
    needed_by: dict[str, list[str]] = {}
    for name, registered in sorted(agents.agents.items()):
        for variable, tool in registered.agent.unset_needs(settings.is_set):
            needed_by.setdefault(variable, []).append(f"{name} ({tool})")
    for variable, users in needed_by.items():
        yield (
            f"settings: {variable} is not set, needed by {', '.join(users)} "
            f"({where_to_set(variable)})"
        )


def _schema_problems() -> Iterator[str]:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    at = current()
    if at != head:
        yield (
            f"schema: the database is at {at or 'no schema yet'}, this release needs {head}: "
            "run `nightshift migrate` (once, before the new workers start)"
        )


def _probe(probe: Callable[[float], None]) -> str | None:
    """None when `probe` answers within the timeout; else one line saying why (never a
    password)."""
    try:
        probe(TIMEOUT_SECONDS)
    except Exception as exc:  # whatever it is, it is this line's problem: name it and go on
        return describe(exc) or f"{type(exc).__name__}: {exc}"
    return None
