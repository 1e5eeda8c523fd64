"""`nightshift watch RUN|BATCH`: live progress until the run or batch is done.

It reads the same progress feed as the API's Server-Sent Events (pipeline/views/feed.py): one
line per event (a step started, the model replied, a tool returned, an action changed state,
the run waits or finished), from now on, or from the start with --history.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.live import Live
from rich.text import Text
from sqlalchemy import func, select

from models import Batch, Run, RunStatus
from pipeline.cli.failures import following
from pipeline.cli.format import console, on_terminal, progress_bar
from pipeline.db import transaction
from pipeline.errors import NightshiftError, RunNotFound
from pipeline.views.feed import START, FeedEvent, Subject, latest_position, read
from pipeline.views.runs import resolve_run_id


def register(add: Callable[..., argparse.ArgumentParser]) -> None:
    watch = add("watch", cmd_watch, "follow a run or a batch live until it is done")
    watch.add_argument("target", help="a run id (or its first characters) or a batch id")
    watch.add_argument("--history", action="store_true", help="first show every earlier event")
    watch.add_argument(
        "--interval", type=float, default=1.0, help="at most this many seconds between looks"
    )
    watch.add_argument("--timeout", type=float, default=0, help="give up after N s (0: never)")


def cmd_watch(args: argparse.Namespace) -> int:
    subject, summary = _look_at(args.target)
    display = LiveLine() if on_terminal() else PlainLines()
    with following(subject.scope, subject.run_id or subject.batch_id), display as out:
        return _follow(args, subject, summary, out)


def _follow(
    args: argparse.Namespace,
    subject: Subject,
    summary: Callable[[], tuple[str, bool]],
    out: PlainLines,
) -> int:
    give_up = time.monotonic() + args.timeout if args.timeout else None
    line, settled = summary()
    out.line(line)
    after = START if args.history else latest_position()
    while True:
        page = read(subject, after)
        for event in page.events:
            out.line(describe(event, prefix=subject.batch_id is not None), at=event.at)
            after = event.position
        if page.done:
            return 0
        if page.events:
            line, settled = summary()
            out.status(line)
        if settled:  # waits for a person to say what happened: nothing moves until then
            out.line("waits for a person (nightshift actions list --state outcome_unknown)")
            return 0
        if give_up is not None and time.monotonic() > give_up:
            out.line("still going; stopped watching (--timeout)", stamp=False)
            return 1
        if not page.events:
            time.sleep(args.interval)


def _clock(at: datetime | None) -> str:
    """An event's own time (local), so --history shows when things happened; else now."""
    return time.strftime("%H:%M:%S") if at is None else at.astimezone().strftime("%H:%M:%S")


class PlainLines:
    """One line per event, with the time: for pipes, logs and scripts."""

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def line(self, text: str, stamp: bool = True, at: datetime | None = None) -> None:
        print(f"{_clock(at)}  {text}" if stamp else text, flush=True)

    def status(self, text: str) -> None:
        """Where things stand now: plain output has only the event lines."""


class LiveLine(PlainLines):
    """On a terminal: the event lines scroll, and the run's or batch's state (a progress bar
    for a batch) stays at the bottom, updated in place."""

    def __init__(self) -> None:
        self._live = Live(Text(""), console=console(), refresh_per_second=4, transient=True)

    def __enter__(self) -> LiveLine:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(None, None, None)

    def line(self, text: str, stamp: bool = True, at: datetime | None = None) -> None:
        shown = Text.from_ansi(text)
        if stamp:
            shown = Text.assemble((_clock(at), "dim"), "  ", shown)
        self._live.console.print(shown)

    def status(self, text: str) -> None:
        self._live.update(Text.assemble(("now  ", "bold"), Text.from_ansi(text)))


def step_attempt(data: dict[str, Any]) -> str:
    """` (attempt N)` for a step started again after a failed attempt, else nothing: the run's
    `attempt` counts every claim (one per step), so it says nothing about crashes."""
    attempt = data.get("step_attempt") or 1  # events written before migration 0025 have none
    return f" (attempt {attempt})" if attempt > 1 else ""


def describe(event: FeedEvent, prefix: bool = False) -> str:
    """One line a person reads for a feed event."""
    data = event.data
    step = f"step {data.get('step')}"
    if event.type == "run_started":
        said = f"started ({data.get('agent')})"
    elif event.type == "step_started":
        said = f"{step} started on {data.get('worker')}{step_attempt(data)}"
    elif event.type in ("model_replied", "tool_result", "note", "timer_set"):
        said = f"{step} {data.get('summary')}"
    elif event.type == "action_changed":
        said = f"action {data.get('key')} ({data.get('tool')}): {data.get('state')}"
    elif event.type == "version_changed":
        said = f"now running under agent version {data.get('to')} (was {data.get('from')})"
    elif event.type == "waiting":
        until = f" until {data['wake_at']}" if data.get("wake_at") else ""
        said = f"{data.get('status')} on {data.get('waiting_on')}{until}"
    elif event.type == "finished":
        error = f": {data['error']}" if data.get("error") else ""
        said = f"{data.get('status')} ({data.get('stop_reason')}){error}"
    elif event.type == "batch_changed":
        reason = f" ({data['stop_reason']})" if data.get("stop_reason") else ""
        return f"batch {data.get('status')}{reason}"
    else:
        said = event.type
    return f"run {(event.run_id or '')[:8]}  {said}" if prefix else said


def _look_at(target: str) -> tuple[Subject, Callable[[], tuple[str, bool]]]:
    with transaction() as session:
        if session.get(Batch, target) is not None:
            return Subject(batch_id=target), lambda: _batch_line(target)
    try:
        run_id = resolve_run_id(target)
        with transaction() as session:
            if session.get(Run, run_id) is None:
                raise RunNotFound()
    except RunNotFound:
        raise NightshiftError(f"{target!r} is neither a run id nor a batch id") from None
    return Subject(run_id=run_id), lambda: _run_line(run_id)


def _run_line(run_id: uuid.UUID) -> tuple[str, bool]:
    """The run now, and whether only a person can move it on."""
    with transaction() as session:
        run = session.get(Run, run_id)
        assert run is not None
        where = f" on {run.lease_owner}" if run.lease_owner else ""
        waiting = f" waiting on {run.waiting_on}" if run.waiting_on else ""
        line = (
            f"{run.agent} {run.status}{waiting}  step {run.step}/{run.max_steps}{where}  "
            f"tokens {run.input_tokens + run.output_tokens}"
            + (f"  ({run.stop_reason})" if run.stop_reason else "")
        )
        return line, run.status is RunStatus.NEEDS_ATTENTION


def _batch_line(batch_id: str) -> tuple[str, bool]:
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        counts: dict[RunStatus, int] = dict(
            session.execute(
                select(Run.status, func.count())
                .where(Run.batch_id == batch_id)
                .group_by(Run.status)
            ).all()
        )
        total = sum(counts.values())
        done = sum(n for status, n in counts.items() if status.is_terminal())
        parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        line = f"{batch.name} {batch.status}  {progress_bar(done, total)}  {parts}"
        return line, False
