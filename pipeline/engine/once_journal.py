"""`pipeline.once` inside a step: the result is journaled under `once:<key>` in a fenced write,
so a replay of the step (after a crash, on any worker) returns it without running fn again.
A crash between fn() and that commit leaves nothing: the replay runs fn again (see `once`).

Each entry also records where the tool call asked for it (the call's id and its place among
the call's once calls), so a replay by a release whose tool code changed can tell a recorded
call the new code would not make (it asks another key there, or stops short of it) from a
new one: engine/drift.py parks the run before fn runs under the new key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from pipeline.crash import crash_point
from pipeline.engine import journal as jr
from pipeline.engine.leases import Lease, fenced
from pipeline.errors import NightshiftError, PermanentError
from pipeline.keys import once_key

T = TypeVar("T")

ONCE_STEP = "once"

Mismatch = Callable[[int, str, str | None], None]
"""Told of a recorded once call the code does not make: (its place, the key recorded there,
the key the code asks there or None when it asks none). Raises to stop the step."""


class JournalOnce:
    """The OnceStore of one tool call in a step: each result journaled in a fenced write."""

    def __init__(
        self,
        lease: Lease,
        journal: jr.Journal,
        step: int,
        call_id: str,
        mismatch: Mismatch | None = None,
    ) -> None:
        self.lease = lease
        self.journal = journal
        self.step = step
        self.call_id = call_id
        self.mismatch = mismatch
        """None: the calls are not compared (the same release replays its own calls)."""
        self._recorded = recorded_calls(journal, call_id) if mismatch else {}
        self._asked = 0

    def once(self, key: str, fn: Callable[[], T]) -> T:
        try:
            entry = once_key(key)
        except NightshiftError as exc:
            raise PermanentError(str(exc)) from None
        place, self._asked = self._asked, self._asked + 1
        recorded = self._recorded.get(place)
        if self.mismatch is not None and recorded is not None and recorded != key:
            self.mismatch(place, recorded, key)
        stored = self.journal.replay(entry, ONCE_STEP)
        if stored is not None:
            result: Any = stored["result"]
            return result
        value = fn()
        crash_point("after_once_ran")
        try:
            # What a replay would return: the value as JSON gives it back.
            result = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise PermanentError(
                f"once({key!r}): the result ({type(value).__name__}) cannot be kept as JSON: {exc}"
            ) from None
        payload = {"result": result, "call": self.call_id, "place": place}
        with fenced(self.lease) as session:
            self.journal.append_txn(session, entry, self.step, ONCE_STEP, payload)
        crash_point("after_once_committed")
        return result

    def finish(self) -> None:
        """After the tool returned: a recorded once call past the last one it asked for is one
        the code no longer makes."""
        if self.mismatch is None:
            return
        for place in sorted(p for p in self._recorded if p >= self._asked):
            self.mismatch(place, self._recorded[place], None)


def recorded_calls(journal: jr.Journal, call_id: str) -> dict[int, str]:
    """The once calls a tool call journaled, by their place among its once calls: their keys.
    Entries journaled before places were recorded, or found stored by an earlier call, have
    none."""
    return {
        entry.payload["place"]: entry.key.partition(":")[2]  # once:<key>
        for entry in journal.entries
        if entry.step_name == ONCE_STEP and entry.payload.get("call") == call_id
        and isinstance(entry.payload.get("place"), int)
    }  # fmt: skip
