"""What an operator reads about a night, timed with many runs in the database
(bench/night_scale.py): `nightshift batches show` as a command, the batch's status page and
`GET /batches/{id}` and `/metrics` on a real `nightshift api`. Older finished nights are added
by SQL until the database holds the runs asked for."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import output
import records
import scratch

READ_TARGET = 1.0
"""Seconds: `batches show` (beyond the command's own start), the batch page and /metrics
answer within."""

# One older night: a finished batch and its finished children, as the fan-out left them.
_OLD_NIGHT = """
WITH night AS (
    INSERT INTO batches (id, name, params, status, created_at, finished_at)
    VALUES (:id, 'bench_night', '{}', 'succeeded', now() - make_interval(days => :age),
            now() - make_interval(days => :age))
    RETURNING id
)
INSERT INTO runs (id, agent, status, input, step, max_steps, tool_calls, input_tokens,
                  output_tokens, state, fence, attempt, cancel_requested, code_version,
                  prompt_version, stop_reason, result, batch_id, idempotency_key, created_at,
                  finished_at)
SELECT gen_random_uuid(), 'bench', 'succeeded', '{"steps": 2}', 2, 5000, 1, 300, 40, '{}', 2, 1,
       false, 'old', 'old', 'completed', '{"text": "Done after 2 steps."}', night.id,
       night.id || ':child:' || n, now() - make_interval(days => :age),
       now() - make_interval(days => :age)
  FROM night, generate_series(0, :children - 1) AS n
"""


@dataclass(frozen=True)
class Reads:
    """Median seconds of each read, with `runs` runs in the database."""

    runs: int
    command: float
    """`nightshift batches show BATCH`, the whole process."""
    command_unknown: float
    """The same command for a batch that does not exist: its start, connection and one query."""
    in_process: float
    """show_batch() and the command's text, in this process."""
    page: float
    """GET /ui/batches/{id}, signed in."""
    api: float
    """GET /batches/{id}."""
    metrics: float
    feed: float
    """One idle re-read of the batch's progress feed (no new event): what an open page's event
    stream costs the database each poll."""


def run_count() -> int:
    return int(records.sql("SELECT count(*) FROM runs")[0][0])


def add_old_nights(upto: int, night_size: int) -> None:
    """Finished nights of `night_size` children (the last one smaller) until `upto` runs."""
    old = "SELECT count(*) FROM batches WHERE id LIKE 'bench-night-old:%'"
    age = int(records.sql(old)[0][0]) + 1
    while (missing := upto - run_count()) > 0:
        records.sql(
            _OLD_NIGHT, id=f"bench-night-old:{age}", age=age, children=min(night_size, missing)
        )
        age += 1
    records.sql("ANALYZE")


def median_time(read: Callable[[], object], repeat: int) -> float:
    """The median of `repeat` timings, after one warm-up."""
    read()
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        read()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def command(*argv: str, expect: int = 0) -> Callable[[], None]:
    def run() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *argv], capture_output=True, check=False
        )
        if done.returncode != expect:
            raise RuntimeError(
                f"nightshift {' '.join(argv)}: exit {done.returncode}: {done.stderr!r}"
            )

    return run


def signed_in(api_url: str, token: str) -> httpx.Client:
    """A client with the status page's session cookie, signed in with a person's token."""
    client = httpx.Client(base_url=api_url, timeout=60)
    form = client.get("/ui/login")
    match = re.search(r'name="csrf" value="([^"]+)"', form.text)
    if match is None:
        raise RuntimeError("the sign-in form carries no CSRF token")
    answer = client.post("/ui/login", data={"token": token, "csrf": match.group(1)})
    if answer.status_code != 303:
        raise RuntimeError(
            f"signing in to the status page: {answer.status_code} {answer.text[:200]}"
        )
    return client


def get(client: httpx.Client, path: str, **options: object) -> Callable[[], None]:
    def read() -> None:
        client.get(path, **options).raise_for_status()  # type: ignore[arg-type]

    return read


def measure(bench: scratch.Scratch, batch_id: str, at: Sequence[int], repeat: int) -> list[Reads]:
    """The reads about `batch_id`, with the database at each of `at` runs (or above)."""
    from pipeline.chaos.webhook import ApiServer, create_token
    from pipeline.cli.batches import describe
    from pipeline.views.batches import show_batch
    from pipeline.views.feed import Subject, latest_position, read

    night_size = int(
        records.sql("SELECT count(*) FROM runs WHERE batch_id = :id", id=batch_id)[0][0]
    )
    api = ApiServer(bench.log_dir / "api.log", {}).start()
    bearer = {"Authorization": f"Bearer {api.api_token}"}
    try:
        page_client = signed_in(api.url, create_token("bench@example.com", {}))
        path = f"/batches/{quote(batch_id)}"
        found: list[Reads] = []
        for runs in at:
            output.log(f"reads at {runs:,} runs: adding older nights")
            add_old_nights(runs, night_size)
            output.log(f"reads at {run_count():,} runs")
            found.append(
                Reads(
                    runs=run_count(),
                    command=median_time(command("batches", "show", batch_id), repeat),
                    command_unknown=median_time(
                        command("batches", "show", "no-such-batch", expect=2), repeat
                    ),
                    in_process=median_time(lambda: describe(show_batch(batch_id)), repeat),
                    page=median_time(get(page_client, f"/ui{path}"), repeat),
                    api=median_time(get(page_client, path, headers=bearer), repeat),
                    metrics=median_time(get(page_client, "/metrics", headers=bearer), repeat),
                    feed=median_time(
                        lambda: read(Subject(batch_id=batch_id), latest_position()), repeat
                    ),
                )
            )
        page_client.close()
    finally:
        api.stop()
    return found


def print_reads(reads: Sequence[Reads]) -> None:
    output.print_table(
        "night_scale: reading the largest batch (median), by runs in the database",
        ["runs", "batches show (command)", "the command, no such batch", "show_batch in process",
         "batch page", "GET /batches/{id}", "/metrics", "feed re-read"],
        [
            [f"{r.runs:,}", output.ms(r.command), output.ms(r.command_unknown),
             output.ms(r.in_process), output.ms(r.page), output.ms(r.api), output.ms(r.metrics),
             output.ms(r.feed)]
            for r in reads
        ],
    )  # fmt: skip


def verdicts(reads: Sequence[Reads]) -> list[str]:
    """The targets at the most runs: `batches show`'s answer (its start, the same for any
    batch and any database, is shown beside it), the batch page and /metrics, each under a
    second."""
    if not reads:
        return []
    last = reads[-1]

    def met(seconds: float) -> str:
        return f"{output.ms(seconds)} ({'met' if seconds < READ_TARGET else 'MISSED'})"

    return [
        f"at {last.runs:,} runs (targets < {READ_TARGET:g} s): batches show answers in"
        f" {met(last.in_process)}, the command in all {output.secs(last.command)}, of which"
        f" its start is most (no such batch: {output.secs(last.command_unknown)});"
        f" the batch page {met(last.page)}; /metrics {met(last.metrics)}",
    ]
