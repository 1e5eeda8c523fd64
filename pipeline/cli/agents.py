"""`nightshift agents`: every registered agent, where it comes from, its tools and its input."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pipeline.cli.format import print_json
from pipeline.registry import SHIPPED_ENV, registry
from pipeline.views.agents import describe_agents

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand

FOREVER_SECONDS = 100 * 365 * 86400


def register(add: AddCommand) -> None:
    command = add(
        "agents",
        cmd_agents,
        "list the registered agents: package, prompt version, tools (side effects, approvals) "
        "and input schema",
    )
    command.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_agents(args: argparse.Namespace) -> int:
    agents = describe_agents()
    if args.json:
        print_json(agents)
        return 0
    blocks = [_text(agent) for agent in agents] or ["no agents registered here"]
    off = sorted(registry().shipped_off)
    if off:
        blocks.append(f"nightshift's shipped agents off here: {', '.join(off)} (turn them on "
                      f"with {SHIPPED_ENV}=all or their names)")  # fmt: skip
    print("\n\n".join(blocks))
    return 0


def _text(agent: dict[str, Any]) -> str:
    lines = [
        f"{agent['name']}  ({agent['package']}, {agent['path']})",
        f"  prompt {agent['prompt_version']}  model: {agent['model']}",
        f"  input: {_input(agent['input_schema'])}",
        f"  schedule job: {agent['schedule_job']}",
    ]
    if agent["event_sources"]:
        lines.append(f"  events from: {', '.join(agent['event_sources'])}")
    width = max((len(t["name"]) for t in agent["tools"]), default=0)
    for index, tool in enumerate(agent["tools"]):
        label = "  tools: " if index == 0 else "         "
        lines.append(f"{label}{tool['name'].ljust(width)}  {_marks(tool)}".rstrip())
    if not agent["tools"]:
        lines.append("  tools: none")
    return "\n".join(lines)


def _input(schema: dict[str, Any]) -> str:
    """`team* (string), date* (string), sources (array)`: * marks a required field."""
    properties = schema.get("properties") or {}
    if not properties:
        return "any JSON object" if schema.get("type") == "object" else str(schema)
    required = set(schema.get("required") or [])
    fields = [
        f"{name}{'*' if name in required else ''} ({spec.get('type', 'any')})"
        for name, spec in properties.items()
    ]
    return ", ".join(fields) + ("   (* required)" if required else "")


def _marks(tool: dict[str, Any]) -> str:
    return "; ".join([*_effect_marks(tool), *_need_marks(tool)])


def _need_marks(tool: dict[str, Any]) -> list[str]:
    unset = set(tool["needs_unset"])
    return [
        f"needs {name}" + (" (not set here)" if name in unset else "") for name in tool["needs"]
    ]


def _effect_marks(tool: dict[str, Any]) -> list[str]:
    effect = tool["side_effect"]
    if effect is None:
        return ["timer: the run waits with no process" if tool["timer"] else "no side effect"]
    marks = [f"side effect on {effect['service']}"]
    retention = effect["key_retention_seconds"]
    if effect["honours_keys"] and retention is not None:
        kept = "forever" if retention > FOREVER_SECONDS else f"{retention / 3600:g} h"
        marks.append(f"honours keys ({kept})")
    if effect["lookup"]:
        marks.append("lookup")
    if effect["namespace"]:
        marks.append(f"keys shared in {effect['namespace']!r}")
    if tool["requires_approval"]:
        who = ", ".join(tool["approvers"]) or "anyone allowed to approve"
        marks.append(f"needs approval ({who})")
    return marks
