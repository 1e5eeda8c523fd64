"""`pipeline.once` inside a step: the result is journaled under `once:<key>` in a fenced write,
so a replay of the step (after a crash, on any worker) returns it without running fn again.
A crash between fn() and that commit leaves nothing: the replay runs fn again (see `once`)."""

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


class JournalOnce:
    """The OnceStore of one tool call in a step: each result journaled in a fenced write."""

    def __init__(self, lease: Lease, journal: jr.Journal, step: int) -> None:
        self.lease = lease
        self.journal = journal
        self.step = step

    def once(self, key: str, fn: Callable[[], T]) -> T:
        try:
            entry = once_key(key)
        except NightshiftError as exc:
            raise PermanentError(str(exc)) from None
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
        with fenced(self.lease) as session:
            self.journal.append_txn(session, entry, self.step, ONCE_STEP, {"result": result})
        crash_point("after_once_committed")
        return result
