"""Another service starts on-call digests with nothing but Celery installed: no nightshift
import, only the task's name. Usage:

    python start_from_another_service.py REDIS_URL QUEUE TEAM DATE [TEAM DATE ...]

Prints one JSON line: the run ids, and whether nightshift was importable here (it is not
needed). The first digest is started with `send_task`, the others with `.delay()` on a
signature; both wait for the run id, which `pipeline.start_run` returns. A message sent to a
queue no nightshift worker reads (Celery's default `celery`, when `queue=` is left out) is never
answered: the wait ends in one line that says so, not in a bare TimeoutError.
"""

from __future__ import annotations

import json
import sys

from celery import Celery
from celery.exceptions import TimeoutError as NoReply
from celery.result import AsyncResult


def main(broker: str, queue: str, *team_dates: str, timeout: float = 120) -> dict[str, object]:
    app = Celery("billing-service", broker=broker, backend=broker)
    requests = [
        {"team": team, "date": date}
        for team, date in zip(team_dates[::2], team_dates[1::2], strict=True)
    ]
    first, *others = requests
    pending = [
        # plain Celery, by name: args are (agent, input, idempotency key)
        app.send_task(
            "pipeline.start_run",
            args=["oncall_digest", first, f"digest:{first['team']}:{first['date']}"],
            queue=queue,
        )
    ]
    start_run = app.signature("pipeline.start_run", queue=queue)
    pending += [
        start_run.delay("oncall_digest", request, f"digest:{request['team']}:{request['date']}")
        for request in others
    ]
    run_ids = run_ids_of(pending, queue, timeout)
    return {
        "run_ids": run_ids,
        "nightshift_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "pipeline"),
        "nightshift_importable": _importable("pipeline"),
    }


def run_ids_of(pending: list[AsyncResult], queue: str, timeout: float) -> list[str]:
    """The run ids `pipeline.start_run` answers with; no answer in time ends the program with
    the likely cause (a wrong or missing queue) in one line."""
    try:
        return [str(result.get(timeout=timeout)) for result in pending]
    except NoReply:
        for result in pending:  # let go of the replies now, not in __del__ at interpreter exit
            result.backend.remove_pending_result(result)
        raise SystemExit(
            f"no run id after {timeout:g}s: no nightshift worker consumes queue {queue!r}; "
            'check queue="nightshift" (nightshift\'s NIGHTSHIFT_QUEUE) and that a worker runs'
        ) from None


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
