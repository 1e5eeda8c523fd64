"""What a night's fan-out and a step's hand-off cost in this process, with no worker running:
`fire` of a bench night's slot (the batch and its children in one transaction, their first
steps pushed after the commit) for each of `--children`, and `--sends` calls of `send_step`
(one hand-off each: what a step's checkpoint sends). Wall and CPU time; `--profile` adds the
functions cProfile finds most of the time in.

Run it against two trees to compare them, e.g. `PYTHONPATH=/tmp/other-tree python
bench/fan_out.py` (the first directory on PYTHONPATH is the `pipeline` imported).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import output
import redis
import scratch

NAME = "fan_out"
REDIS_DB = 7


@contextmanager
def timed(profile: bool, notes: list[str], label: str) -> Iterator[list[float]]:
    """[wall seconds, CPU seconds] of the block, filled in at its end."""
    spent: list[float] = []
    profiler = cProfile.Profile() if profile else None
    wall, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    yield spent
    if profiler:
        profiler.disable()
    spent += [time.perf_counter() - wall, time.process_time() - cpu]
    if profiler:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(15)
        notes.append(f"{label}, under cProfile:\n{text.getvalue()}")


def fan_out(children: int) -> Callable[[], None]:
    from pipeline.runs.schedules import fire
    from pipeline.slots import Missed, Overlap, Schedule

    schedule = Schedule(
        name=f"fan-out-{children}", agent="bench", minute="*",
        params={"children": children, "steps": 2}, missed=Missed.SKIP, overlap=Overlap.ALLOW,
    )  # fmt: skip
    return lambda: fire(schedule.name, now=datetime.now(UTC), schedules=[schedule])


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--children", default="10000", help="fan-out sizes (10000)")
    parser.add_argument("--sends", type=int, default=3000, help="send_step calls (3000)")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    args = parser.parse_args(argv)
    rows: list[list[str]] = []
    notes: list[str] = []
    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        from pipeline.app import send_step
        from pipeline.settings import get_settings

        client = redis.Redis.from_url(bench.broker_url)
        queue = get_settings().queue
        for size in [int(n) for n in args.children.split(",")]:
            run = fan_out(size)
            with timed(args.profile, notes, f"fan-out of {size:,}") as spent:
                run()
            queued = int(client.llen(queue))
            client.delete(queue)
            rows.append([f"fan-out of {size:,} children", output.secs(spent[0]),
                         output.secs(spent[1]), f"{queued:,} queued"])  # fmt: skip
        runs = [uuid.uuid4() for _ in range(args.sends)]
        send_step(runs[0], agent="bench", step=1, batch="warm-up", handed_off=time.time())
        with timed(args.profile, notes, f"{args.sends:,} sends") as spent:
            for run_id in runs:
                send_step(run_id, agent="bench", step=1, batch="night", handed_off=time.time())
        client.delete(queue)
        client.close()
        rows.append([f"send_step, each of {args.sends:,}", output.ms(spent[0] / args.sends),
                     output.ms(spent[1] / args.sends), ""])  # fmt: skip
    output.print_table("fan_out: in this process, no workers", ["what", "wall", "CPU", ""], rows)
    output.print_notes(bench.machine(), *notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
