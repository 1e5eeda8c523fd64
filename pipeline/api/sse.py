"""Server-Sent Events over the progress feed (pipeline/views/feed.py), for the API and the page.

Each event is `id: <position>`, `event: <type>`, `data: <one line of JSON>`; a client that
reconnects sends the last id as Last-Event-ID and continues right after it. The stream polls
the feed (fast while things happen, backing off to every POLL_SLOW seconds when idle), sends
a comment every KEEPALIVE seconds so proxies keep it open, ends with `event: end` once the
run or batch has finished and everything was sent, and closes after MAX_STREAM seconds
anyway (the client reconnects where it was).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from pipeline.views.feed import FeedEvent, Position, Subject, check_subject, parse_position, read

BATCH = 500
"""Events per read; a full batch is followed by the next read at once."""

POLL_FAST = 0.25
POLL_SLOW = 2.0
KEEPALIVE = 15.0
MAX_STREAM = 600.0
RECONNECT_MS = 2000

MEDIA_TYPE = "text/event-stream"
OPENAPI_STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A stream of Server-Sent Events (see the README: live progress).",
        "content": {MEDIA_TYPE: {"schema": {"type": "string"}}},
    }
}


async def event_stream(subject: Subject, last_event_id: str | None) -> StreamingResponse:
    """The response for `subject`'s events after `last_event_id` (the beginning if none).

    Raises before anything is sent when the subject is unknown or the id is not one of ours."""
    after = parse_position(last_event_id)
    await run_in_threadpool(check_subject, subject)
    return StreamingResponse(
        _frames(subject, after),
        media_type=MEDIA_TYPE,
        headers={"X-Accel-Buffering": "no"},  # nginx: pass each event on at once
    )


async def _frames(subject: Subject, after: Position) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    started = quiet_since = loop.time()
    interval = POLL_FAST
    yield f"retry: {RECONNECT_MS}\n\n".encode()
    while True:
        page = await run_in_threadpool(read, subject, after, BATCH)
        for event in page.events:
            yield frame(event)
            after = event.position
        if len(page.events) == BATCH:
            continue
        if page.done:
            yield b"event: end\ndata: {}\n\n"
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
