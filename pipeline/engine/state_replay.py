"""The agent state through one step, replayed like the journal.

A step starts from the state its run's last checkpoint wrote. Each tool call that changed it
journals the whole document with its result (`state` in the `tool:<id>` entry, in the same
fenced write); a call replayed from the journal after a crash brings its document back instead
of running again, so no change is made twice or lost. The checkpoint writes the document the
step ends with (step.sql's checkpoint), and only when the step changed it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.tools.agent_state import ARTIFACTS, AgentState, agent_part

JOURNALED = "state"
"""The entry of a tool result's payload that holds the document the call left."""


class StepState:
    def __init__(self, run_state: Mapping[str, Any], max_bytes: int) -> None:
        self._run_state = dict(run_state)
        self._loaded = agent_part(run_state)
        self.document = self._loaded
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
        """The document for the checkpoint to write; None when the step left it unchanged."""
        return None if self.document == self._loaded else self.document

    def run_state(self) -> dict[str, Any]:
        """runs.state as the step leaves it (what a success check and a run's answer read)."""
        artifacts = self._run_state.get(ARTIFACTS)
        return {**self.document, **({ARTIFACTS: artifacts} if artifacts is not None else {})}
