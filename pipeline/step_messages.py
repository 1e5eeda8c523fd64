"""A step message as it lies in Redis: a Celery task message (protocol 2: headers, properties,
the body `[args, kwargs, embed]`) in kombu's Redis envelope, built from a template made once a
process, and pushed onto the queue's list many at a time.

What a worker, Flower, `celery inspect` and `celery events` read is exactly what Celery's own
`send_task` writes for `pipeline.step` (tests/integration/test_step_messages.py holds them
side by side); what is left out is the work `send_task` does per call to get there (its
options, routing, signals, the producer's declare cache and retry wrapper, kombu's envelope):
most of a hand-off's CPU, and one Redis round trip a message where a batch's first steps now
take one a chunk.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from celery.utils.nodenames import anon_nodename

from pipeline.crash import crash_point

STEP_TASK = "pipeline.step"

HANDED_OFF = "handed_off"
"""A step message's header: when its run was handed to this step, in PostgreSQL's clock (epoch
seconds: the `runs.updated_at` its hand-off wrote). The tick compares runs with the oldest
queued messages' (pipeline/app.py `queued_since`)."""

CHUNK = 200
"""Messages a push sends in one LPUSH (a 100,000-child night: 500 round trips, ~300 KiB each)."""

# The body's third element: no callbacks, errbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def step_kwargs_repr(kwargs: dict[str, Any]) -> str:
    """What Flower's kwargs column shows of a step: agent, step, a short run id and the batch
    (a night's child is read by its batch) first, so they fit the column; the whole run id
    after them for Flower's `kwargs:run_id=` search (it reads this back as a dict literal)."""
    shown = {"agent": kwargs["agent"], "step": kwargs["step"], "run": kwargs["run_id"][:8]}
    if kwargs.get("batch"):
        shown["batch"] = kwargs["batch"]
    return repr(shown | kwargs)


@dataclass(frozen=True)
class Step:
    """One step message to send: the task's keyword arguments, the hand-off's time
    (HANDED_OFF; None: not known), and a delay (an ETA the worker holds the message for)."""

    kwargs: dict[str, Any]
    handed_off: float | None = None
    countdown: float | None = None


class StepMessages:
    """Step messages for one queue. The headers and properties every step shares are built
    once (the origin once a process: it names the process that sent the message); a message
    fills in its task id, kwargs, ETA and hand-off time."""

    def __init__(
        self, queue: str, time_limits: tuple[float | None, float | None] = (None, None)
    ) -> None:
        self.queue = queue
        # [hard, soft], as Celery's send_task puts a registered task's limits in the message
        # (task_time_limit and task_soft_time_limit); a worker applies the message's.
        self.time_limits = list(time_limits)
        self._pid = -1
        self._headers: dict[str, Any] = {}
        self._properties = {
            "reply_to": "",
            "delivery_mode": 2,  # persistent, as Celery's default queue has it
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
        }

    def encode(self, step: Step) -> tuple[str, bytes]:
        """(task id, the message as LPUSH stores it)."""
        task_id = str(uuid.uuid4())
        headers = self._shared_headers() | {
            "id": task_id,
            "root_id": task_id,
            "kwargsrepr": step_kwargs_repr(step.kwargs),
            "eta": eta_of(step.countdown),
        }
        if step.handed_off is not None:
            headers[HANDED_OFF] = step.handed_off
        body = json.dumps([[], step.kwargs, _EMBED]).encode()
        envelope = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": self._properties
            | {"correlation_id": task_id, "delivery_tag": str(uuid.uuid4())},
        }
        return task_id, json.dumps(envelope).encode()

    def _shared_headers(self) -> dict[str, Any]:
        if self._pid != os.getpid():  # first use, or a forked child: its own origin
            self._headers = {
                "lang": "py",
                "task": STEP_TASK,
                "shadow": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": self.time_limits,
                "parent_id": None,
                "argsrepr": "()",
                "origin": anon_nodename(),
                "ignore_result": True,  # nobody reads a step's return value
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
            }
            self._pid = os.getpid()
        return self._headers


def eta_of(countdown: float | None) -> str | None:
    """The ETA header of a message delayed by `countdown` seconds, as Celery writes it."""
    if not countdown:
        return None
    return (datetime.now(UTC) + timedelta(seconds=countdown)).isoformat()


def push(client: Any, queue: str, messages: Iterable[bytes]) -> int:
    """LPUSH the messages onto the queue's list in order (the first is taken first), CHUNK at
    a time, each chunk one command: how many were pushed."""
    pushed = 0
    chunks = _chunks(iter(messages))
    chunk = next(chunks, None)
    while chunk is not None:
        client.lpush(queue, *chunk)
        pushed += len(chunk)
        chunk = next(chunks, None)
        if chunk is not None:
            crash_point("between_publish_chunks")
    return pushed


def _chunks(messages: Iterator[bytes]) -> Iterator[list[bytes]]:
    while chunk := list(islice(messages, CHUNK)):
        yield chunk
