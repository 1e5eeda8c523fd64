"""The in-process hand-off: a test's step queue (pipeline.app.StepQueue) keeps the step messages
the engine, the tick and a decision send, in order, and runs each one as a worker's
`pipeline.step` task does (engine/time_limit.py's execute_bounded_step, the real step), until
none is left: the run then has ended or waits."""

from __future__ import annotations

import math
import threading
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

from pipeline.engine.holders import holder_here
from pipeline.engine.time_limit import execute_bounded_step
from pipeline.settings import Settings
from pipeline.step_messages import Step


class InProcessQueue:
    def __init__(self) -> None:
        self._messages: deque[tuple[dict[str, Any], float | None]] = deque()

    def send(self, steps: Sequence[Step]) -> None:
        # No countdown: nothing else runs meanwhile.
        self._messages.extend((step.kwargs, step.handed_off) for step in steps)

    def queued_since(self, queue: str, looked_at: int) -> float:
        if not self._messages:
            return math.inf
        told = [when for _, when in list(self._messages)[:looked_at] if when is not None]
        return min(told, default=-math.inf)

    def run_all(self, settings: Settings, most: int) -> int:
        """Deliver every message, and those their steps send, as a worker would; at most
        `most` deliveries (a run that never stops fails the test, not the machine)."""
        owner = str(holder_here(threading.current_thread().name))
        delivered = 0
        while self._messages:
            if delivered == most:
                raise AssertionError(f"the run was still going after {most} steps")
            message, _ = self._messages.popleft()
            execute_bounded_step(uuid.UUID(message["run_id"]), owner, settings)
            delivered += 1
        return delivered
