"""The agent state through one step, replayed like the journal.

Each tool call that changed the state journals the whole document with its result (`state` in
the `tool:<id>` entry, in the same fenced write). A step starts from the document the last such
entry of an earlier step holds (none: the run's record, runs.state); a call of its own replayed
from the journal after a crash brings its document back instead of running again, so no change
is made twice or lost. The checkpoint writes the document the step ends with to runs.state
(step.sql's checkpoint), when it differs from what the record holds. A run whose journal was
copied from another (a fork) thus starts from the state its copied steps left."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.engine.journal import Entry
from pipeline.keys import EntryKind, entry_kind
from pipeline.tools.agent_state import ARTIFACTS, AgentState, agent_part

JOURNALED = "state"
"""The entry of a tool result's payload that holds the document the call left."""


class StepState:
    def __init__(
        self, run_state: Mapping[str, Any], entries: Sequence[Entry], step: int, max_bytes: int
    ) -> None:
        self._run_state = dict(run_state)
        self._recorded = agent_part(run_state)
        journaled = _left_before(entries, step)
        self.document = self._recorded if journaled is None else journaled
        """As the calls so far left it."""
        self.max_bytes = max_bytes

    def for_call(self) -> AgentState:
        """What the next tool call reads and writes (a copy: kept only if the call returns)."""
        return AgentState(self.document, self.max_bytes)

    def changed_by(self, seen: AgentState) -> dict[str, Any] | None:
        """The document a call left, to journal with its result; None when it is unchanged."""
        document = seen.document()
        return None if document == self.document else document

    def follow(self, payload: Mapping[str, Any]) -> None:
        """After a tool call's result, journaled now or replayed: the document it left."""
        if JOURNALED in payload:
            self.document = payload[JOURNALED]

    def to_checkpoint(self) -> dict[str, Any] | None:
        """The document for the checkpoint to write; None when runs.state already holds it."""
        return None if self.document == self._recorded else self.document

    def run_state(self) -> dict[str, Any]:
        """runs.state as the step leaves it (what a success check and a run's answer read)."""
        artifacts = self._run_state.get(ARTIFACTS)
        return {**self.document, **({ARTIFACTS: artifacts} if artifacts is not None else {})}


def _left_before(entries: Sequence[Entry], step: int) -> dict[str, Any] | None:
    """The document the last state-changing tool call before `step` journaled, if any."""
    for entry in reversed(entries):
        kept = entry.payload.get(JOURNALED) if entry.step < step else None
        if kept is not None and entry_kind(entry.key) is EntryKind.TOOL:
            document: dict[str, Any] = kept
            return document
    return None
