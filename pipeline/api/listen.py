"""Long-polls for the API: `GET /runs/{id}?wait=` and `POST /runs?wait=` wait here, holding
no worker and no thread, until the run settles.

One LISTEN connection per event loop serves every request waiting on it: the first waiter
opens it, the last one to leave closes it. A notification for a run wakes its waiters, who
look at the run again; a waiter also looks every RECHECK seconds, so a listener that lost its
connection (or never got one) only makes the wait slower, never wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from fastapi.concurrency import run_in_threadpool

from pipeline.db import BACKEND_PID
from pipeline.views.outcomes import (
    RECHECK,
    SETTLED_CHANNEL,
    RunOutcome,
    can_listen,
    listen_conninfo,
    outcome,
)

log = logging.getLogger("nightshift.api")

MAX_WAIT = 120.0
"""The longest `?wait=` accepted: longer long-polls are cut by proxies anyway."""
RECONNECT_SECONDS = 1.0


async def wait_settled(run_id: uuid.UUID, timeout: float) -> RunOutcome:
    """The run once it finished or started waiting, or as it is after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    async with _listener().watching(str(run_id)) as woken:
        while True:
            woken.clear()  # before looking: a change from now on wakes the wait below
            found = await run_in_threadpool(outcome, run_id)
            left = give_up - loop.time()
            if found.settled or left <= 0:
                return found
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(RECHECK, left))


_LISTENERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Listener] = (
    weakref.WeakKeyDictionary()
)


def _listener() -> _Listener:
    loop = asyncio.get_running_loop()
    listener = _LISTENERS.get(loop)
    if listener is None:
        listener = _LISTENERS[loop] = _Listener()
    return listener


class _Listener:
    """The LISTEN connection of one event loop, open while anyone waits."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    @contextlib.asynccontextmanager
    async def watching(self, run_id: str) -> AsyncIterator[asyncio.Event]:
        woken = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(woken)
        if self._task is None:
            self._listening.clear()
            self._task = asyncio.create_task(self._listen(), name="nightshift-listen")
        try:
            # Until LISTEN is in place a change could go unnoticed: wait for it, briefly.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._listening.wait(), RECONNECT_SECONDS)
            yield woken
        finally:
            waiting = self._waiters.get(run_id, set())
            waiting.discard(woken)
            if not waiting:
                self._waiters.pop(run_id, None)
            if not self._waiters and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    listen_conninfo(), autocommit=True
                ) as connection:
                    if await self._hears(connection):
                        await connection.execute(f"LISTEN {SETTLED_CHANNEL}")
                        self._listening.set()
                        self._wake_all()  # anything missed while not listening: look again
                        async for note in connection.notifies():
                            for woken in self._waiters.get(note.payload, ()):
                                woken.set()
                # Behind a pooler there is nothing to hear: waiters look every RECHECK until
                # the last one leaves (and cancels this task).
                self._listening.set()
                await asyncio.Event().wait()
            except psycopg.Error as exc:
                log.warning("run wait listener: %s; waits poll until it reconnects", exc)
                self._listening.clear()
                self._wake_all()
                await asyncio.sleep(RECONNECT_SECONDS)

    @staticmethod
    async def _hears(connection: psycopg.AsyncConnection[Any]) -> bool:
        session = await (await connection.execute(BACKEND_PID)).fetchone()
        pid = session[0] if session else None
        return can_listen(connection.info.backend_pid, pid)

    def _wake_all(self) -> None:
        for waiting in self._waiters.values():
            for woken in waiting:
                woken.set()
