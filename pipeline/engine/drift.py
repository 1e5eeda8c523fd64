"""Non-determinism a new release can really cause: a journaled entry written under the agent
version a step replaced names what this version no longer matches.

- a replayed model reply calls a tool this version no longer has: the run waits in
  needs_attention (`tool_missing`) until a person allows this version; it never goes back to
  the model as "unknown tool";
- a replayed model reply calls a tool whose schema no longer accepts the journaled arguments:
  reported; a call that already has an action is settled through it, with its recorded
  arguments;
- a replayed tool result belongs to a tool whose side effect now goes to another service:
  reported; the result stands (the effect happened where it was recorded);
- a replayed call whose tool, run by this version's code, asks `once` for another key than
  the one its earlier code journaled at that place, or stops short of a recorded one (a
  recorded call the new code would not make): the run waits in needs_attention
  (`non_determinism`) before `fn` runs under the new key, until a person allows this version
  (its once calls then run as its code asks) or cancels the run.

Each report is a warning naming what changed and a count in nightshift_non_determinism. The
agent's on_version_change was applied before any of this (engine/versions.py): only a run
under `continue`, or one a person allowed, replays this far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import pipeline.instruments as instruments
from models import RunStatus
from pipeline.engine import action_rows as rows
from pipeline.engine.actions import ParkRun
from pipeline.keys import version_wait
from pipeline.logs import get_logger
from pipeline.tools import Tool

if TYPE_CHECKING:
    from pipeline.engine.toolcalls import ToolCall

log = get_logger("nightshift.drift")

TOOL_MISSING = "tool_missing"
"""The stop reason of a run parked on a replayed call to a tool its agent no longer has."""
NON_DETERMINISM = "non_determinism"
"""The stop reason of a run whose replay met a recorded call its code would not make now."""


def check_replayed_call(call: ToolCall, tool: Tool | None) -> None:
    """Before a call of a replayed reply, written under the version this step replaced, runs."""
    assert call.version is not None
    name = call.block["name"]
    if tool is None:
        if call.version.allowed:
            return  # the person who allowed this version saw why: the call is answered removed
        why = (
            f"the journaled reply of step {call.step} calls {name!r}, a tool agent {call.agent} "
            f"no longer has under version {call.version.version}; nightshift allow answers it "
            "as removed and goes on, cancel stops the run"
        )
        _park(call, TOOL_MISSING, why)
    problems = tool.argument_errors(call.block.get("input"))
    if problems:
        _report(
            call,
            "arguments_refused",
            f"{name}'s schema no longer accepts the journaled arguments of step {call.step}: "
            + "; ".join(problems),
        )


def check_replayed_result(call: ToolCall, tool: Tool | None) -> None:
    """Before a journaled tool result, written under the version this step replaced, is
    replayed."""
    if tool is None or tool.side_effect is None:
        return
    action = rows.of_call(call.lease, call.block["id"])
    if action is not None and action.service != tool.side_effect.service:
        _report(
            call,
            "service_changed",
            f"{tool.name}'s result was recorded from service {action.service!r}; this version "
            f"sends it to {tool.side_effect.service!r} (the recorded result stands)",
        )


def once_mismatch(call: ToolCall) -> Callable[[int, str, str | None], None] | None:
    """What a replayed call's once calls are checked with (engine/once_journal.py), None when
    they are not: the call was written under this version, or a person allowed it."""
    if not call.drifted or call.version is None or call.version.allowed:
        return None

    def mismatch(place: int, recorded: str, asked: str | None) -> None:
        assert call.version is not None
        name = call.block["name"]
        now = f"asks once({asked!r}) there" if asked else "no longer makes it"
        why = (
            f"the journaled call of step {call.step} to {name!r} made once({recorded!r}) as its "
            f"once call {place + 1} under an earlier version; {name}'s code under version "
            f"{call.version.version} {now}, so the recorded value would be left behind and "
            "another computed; nightshift allow lets this version's code go on, cancel stops "
            "the run"
        )
        _park(call, NON_DETERMINISM, why)

    return mismatch


def removed(call: ToolCall) -> str:
    """The answer to a call of a tool gone in a version a person allowed."""
    assert call.version is not None
    return (
        f"tool {call.block['name']!r} was removed by a new release of agent {call.agent} "
        f"(version {call.version.version}); a person allowed the run to go on without it, so "
        "it was not run"
    )


def _park(call: ToolCall, kind: str, why: str) -> NoReturn:
    """Report the change and wait in needs_attention until a person allows this version."""
    assert call.version is not None
    _report(call, kind, why)
    raise ParkRun(RunStatus.NEEDS_ATTENTION, version_wait(call.version.version), reason=(kind, why))


def _report(call: ToolCall, kind: str, what: str) -> None:
    log.warning("non-determinism (%s): %s", kind, what)
    instruments.NON_DETERMINISM.labels(call.agent, kind).inc()
