"""The agent's own state in a run: a small JSON document (a plan, facts) that its tools read and
write through `context.state`, and its success check reads as `conversation.state`.

It lives in the run's record (runs.state, beside the runtime's `artifacts` entry), written by
the step's fenced checkpoint; each tool call's change is journaled with its result, so a step
run again after a crash replays the changes its journaled calls made instead of making them
twice (pipeline/engine/state_replay.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.errors import AgentStateTooLarge, PermanentError

ARTIFACTS = "artifacts"
"""The runtime's entry in runs.state (the run's artifacts by name): not the agent's to write."""

DEFAULT_MAX_BYTES = 64 * 1024
"""NIGHTSHIFT_AGENT_STATE_MAX_BYTES's default (a context built outside a step uses it)."""


def agent_part(run_state: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's document in runs.state: every entry but the runtime's artifacts."""
    return {key: value for key, value in run_state.items() if key != ARTIFACTS}


def size_of(document: Mapping[str, Any]) -> int:
    """Bytes of the document as compact JSON: what NIGHTSHIFT_AGENT_STATE_MAX_BYTES bounds."""
    return len(json.dumps(document, separators=(",", ":"), sort_keys=True).encode())


class AgentState(Mapping[str, Any]):
    """The run's agent state as one tool call sees it: read it as a mapping (`state["plan"]`,
    `state.get("facts", {})`, each a copy), change it with `set` and `delete`.

    A call's changes count only if it returns a result (not an error): they are journaled with
    that result and written to the run by the step's checkpoint, so a step run again after a
    crash sees the state its last checkpoint and its journaled calls left, never a change made
    twice or half. The document is at most `max_bytes` (NIGHTSHIFT_AGENT_STATE_MAX_BYTES) as
    compact JSON: a `set` past it raises AgentStateTooLarge and changes nothing.
    """

    def __init__(
        self, document: Mapping[str, Any] | None = None, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._document = copy.deepcopy(dict(document or {}))
        self.max_bytes = max_bytes

    def __getitem__(self, key: str) -> Any:
        # A copy: a change made to it in place would bypass set()'s checks and never be kept.
        return copy.deepcopy(self._document[key])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._document))

    def __len__(self) -> int:
        return len(self._document)

    def __repr__(self) -> str:
        return f"<AgentState {sorted(self._document)}>"

    def set(self, key: str, value: Any) -> None:
        """Keep `value` (JSON: it comes back as JSON gives it, tuples as lists) under `key`."""
        _check_key(key)
        try:
            kept = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise PermanentError(
                f"agent state {key!r}: the value ({type(value).__name__}) cannot be kept as "
                f"JSON: {exc}; nothing was changed"
            ) from None
        changed = {**self._document, key: kept}
        size = size_of(changed)
        if size > self.max_bytes:
            raise AgentStateTooLarge(
                f"agent state {key!r}: the state would be {size} bytes, over the "
                f"{self.max_bytes}-byte limit (NIGHTSHIFT_AGENT_STATE_MAX_BYTES); nothing was "
                "changed"
            )
        self._document = changed

    def delete(self, key: str) -> None:
        """Forget `key` (nothing happens when it is not there)."""
        _check_key(key)
        self._document.pop(key, None)

    def document(self) -> dict[str, Any]:
        """The whole document, a copy (what the engine journals and checkpoints)."""
        return copy.deepcopy(self._document)


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise PermanentError(f"agent state keys are non-empty strings (got {key!r})")
    if key == ARTIFACTS:
        raise PermanentError(
            f"agent state {ARTIFACTS!r} is the runtime's (the run's artifacts): use another key"
        )
