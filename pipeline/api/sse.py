"""Server-Sent Events over the progress feed (pipeline/views/feed.py), for the API and the page.

Each event is `id: <position>`, `event: <type>`, `data: <one line of JSON>`; a client that
reconnects sends the last id as Last-Event-ID and continues right after it. The stream polls
the feed (fast while things happen, backing off to every POLL_SLOW seconds when idle), sends
a comment every KEEPALIVE seconds so proxies keep it open, ends with `event: end` once the
run or batch has finished and everything was sent, and closes after MAX_STREAM seconds
anyway (the client reconnects where it was). Every RECHECK seconds it asks whether the
credential that opened it still holds (a revoked token, an ended page session), and closes if
not: the reconnection is then refused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Header, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from pipeline.views import feed
from pipeline.views.feed import FeedEvent, Position, Subject, check_subject, parse_position, read

BATCH = 500
"""Events per read; a full batch is followed by the next read at once."""

POLL_FAST = 0.25
POLL_SLOW = 2.0
KEEPALIVE = 15.0
MAX_STREAM = 600.0
RECHECK = 2.0
RECONNECT_MS = 2000

POSITION = feed.POSITION.pattern
EVENT_ID: dict[str, Any] = {"pattern": POSITION}
"""An event's id as the schema declares it: parse_position takes every value the pattern
matches and refuses any other, naming the form."""
LastEventId = Annotated[
    str | None,
    Header(
        json_schema_extra=EVENT_ID,
        description="The id of the last event received: the stream resumes right after it.",
    ),
]
After = Annotated[
    str | None,
    Query(
        json_schema_extra=EVENT_ID,
        description="Last-Event-ID as a parameter, for clients that cannot send the header.",
    ),
]

MEDIA_TYPE = "text/event-stream"
END = "end"
"""The last event of a stream whose run or batch has finished; its data is `{}`."""
EVENT = {
    "description": "One event (before OpenAPI 3.2, `schema` of an event stream is one event's).",
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "id": {"type": "string", "pattern": POSITION},
        "event": {"enum": sorted({*feed.TYPES, END})},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "type": "object",
                "description": "The event (`{}` for end): its id and type again, the run and "
                "batch it is about, when, and what the type says.",
                "properties": {
                    "id": {"type": "string", "pattern": POSITION},
                    "type": {"enum": sorted(feed.TYPES)},
                    "run_id": {"type": ["string", "null"], "format": "uuid"},
                    "batch_id": {"type": ["string", "null"]},
                    "at": {"type": "string", "format": "date-time"},
                },
            },
        },
    },
}
OPENAPI_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A stream of Server-Sent Events (see docs/api.md: live progress).",
        "content": {MEDIA_TYPE: {"schema": EVENT}},
    }
}


async def event_stream(
    subject: Subject,
    last_event_id: str | None,
    still_allowed: Callable[[], bool],
    *,
    after: str | None = None,
) -> StreamingResponse:
    """The response for `subject`'s events after `last_event_id` (else `after`, else from the
    beginning), while `still_allowed()` (sync: it may ask the database) says the caller's
    credential holds.

    Raises before anything is sent when the subject is unknown or either id is not one of ours
    (an empty one too)."""
    header, query = parse_position(last_event_id), parse_position(after)
    position = query if last_event_id is None else header
    await run_in_threadpool(check_subject, subject)
    return StreamingResponse(
        _frames(subject, position, still_allowed),
        media_type=MEDIA_TYPE,
        headers={"X-Accel-Buffering": "no"},  # nginx: pass each event on at once
    )


async def _frames(
    subject: Subject, after: Position, still_allowed: Callable[[], bool]
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    started = quiet_since = checked = loop.time()
    interval = POLL_FAST
    yield f"retry: {RECONNECT_MS}\n\n".encode()
    while True:
        if loop.time() - checked > RECHECK:
            if not await run_in_threadpool(still_allowed):
                return  # revoked or signed out: the reconnection gets its 401
            checked = loop.time()
        page = await run_in_threadpool(read, subject, after, BATCH)
        for event in page.events:
            yield frame(event)
            after = event.position
        if len(page.events) == BATCH:
            continue
        if page.done:
            yield f"event: {END}\ndata: {{}}\n\n".encode()
            return
        now = loop.time()
        if now - started > MAX_STREAM:
            return
        if page.events:
            interval, quiet_since = POLL_FAST, now
        else:
            interval = min(interval * 2, POLL_SLOW)
            if now - quiet_since > KEEPALIVE:
                yield b": keepalive\n\n"
                quiet_since = now
        await asyncio.sleep(interval)


def frame(event: FeedEvent) -> bytes:
    data = json.dumps(event.as_json(), separators=(",", ":"), default=str)
    return f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n".encode()
