"""`nightshift watch RUN|BATCH`: live progress until the run or batch is done."""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

from sqlalchemy import func, select

from models import Batch, Run, RunStatus
from pipeline.cli.format import progress_bar
from pipeline.db import transaction
from pipeline.errors import NightshiftError, RunNotFound
from pipeline.views.runs import resolve_run_id

SETTLED_RUN = {s.value for s in RunStatus if s.is_terminal()} | {"needs_attention"}


def register(add: Callable[..., argparse.ArgumentParser]) -> None:
    watch = add("watch", cmd_watch, "follow a run or a batch live until it is done")
    watch.add_argument("target", help="a run id (or its first characters) or a batch id")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between looks")
    watch.add_argument("--timeout", type=float, default=0, help="give up after N s (0: never)")


def cmd_watch(args: argparse.Namespace) -> int:
    look = _look_at(args.target)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    last = ""
    while True:
        line, done = look()
        if line != last:
            print(f"{time.strftime('%H:%M:%S')}  {line}", flush=True)
            last = line
        if done:
            return 0
        if deadline is not None and time.monotonic() > deadline:
            print("still going; stopped watching (--timeout)")
            return 1
        time.sleep(args.interval)


def _look_at(target: str) -> Callable[[], tuple[str, bool]]:
    with transaction() as session:
        if session.get(Batch, target) is not None:
            return lambda: _batch_line(target)
    try:
        run_id = resolve_run_id(target)
        with transaction() as session:
            if session.get(Run, run_id) is None:
                raise RunNotFound()
    except RunNotFound:
        raise NightshiftError(f"{target!r} is neither a run id nor a batch id") from None
    return lambda: _run_line(run_id)


def _run_line(run_id: uuid.UUID) -> tuple[str, bool]:
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
        return line, run.status.value in SETTLED_RUN


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
        return line, batch.status.is_terminal()
