"""Does a Prometheus scrape cost the same however many runs are kept?

`/metrics` (prometheus_client: the workers' counters from their multi-process files, plus
gauges from bounded queries) timed in this process with 1,000 and with 100,000 finished runs
in the database, each with a confirmed action and some with a takeover; the same 50
unfinished runs and 10 pending approvals both times. The baseline, in the same run: the
whole-table figures `nightshift metrics` computes (what `/metrics` computed before).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import output
import records
import scratch

NAME = "metrics_scrape"
REDIS_DB = 15
TARGET = 1.2

_FINISHED = """
WITH done AS (
    INSERT INTO runs (id, agent, status, input, step, max_steps, tool_calls, input_tokens,
                      output_tokens, state, fence, attempt, cancel_requested, code_version,
                      prompt_version, stop_reason, finished_at)
    SELECT gen_random_uuid(), 'bench', CASE WHEN n % 20 = 0 THEN 'failed' ELSE 'succeeded' END,
           '{"steps": 6}', 6, 50, 5, 900, 120, '{}', 1, 1, false, 'old', 'old', 'completed',
           now() - make_interval(mins => n)
      FROM generate_series(1, :runs) AS n
    RETURNING id, status
), actions AS (
    INSERT INTO actions (id, idempotency_key, run_id, tool_use_id, tool, service, args, state,
                         attempts, requires_approval, approvers)
    SELECT gen_random_uuid(), 'bench:' || id, id, 'toolu_bench', 'bench_echo', 'email', '{}',
           'confirmed', 1, false, '[]'
      FROM done
)
INSERT INTO resumptions (run_id, cause, lost_at, resumed_at, fence)
SELECT id, 'lease_expired', now() - interval '1 hour', now() - interval '1 hour' + interval '4 s', 2
  FROM done WHERE status = 'failed'
"""

_UNFINISHED = """
WITH open AS (
    INSERT INTO runs (id, agent, status, input, step, max_steps, tool_calls, input_tokens,
                      output_tokens, state, fence, attempt, cancel_requested, code_version,
                      prompt_version, waiting_on)
    SELECT gen_random_uuid(), 'bench',
           CASE WHEN n <= 20 THEN 'running' WHEN n <= 40 THEN 'waiting' ELSE 'needs_attention' END,
           '{"steps": 6}', 2, 50, 1, 300, 40, '{}', 1, 1, false, 'now', 'now',
           CASE WHEN n > 20 THEN 'approval:bench:' || n END
      FROM generate_series(1, 50) AS n
    RETURNING id, waiting_on
)
INSERT INTO actions (id, idempotency_key, run_id, tool_use_id, tool, service, args, state,
                     attempts, requires_approval, approvers)
SELECT gen_random_uuid(), substr(waiting_on, 10), id, 'toolu_open', 'bench_echo', 'email', '{}',
       'pending_approval', 0, true, '[]'
  FROM open WHERE waiting_on IS NOT NULL LIMIT 10
"""


def add_finished(total: int) -> None:
    chunk = 20_000
    for start in range(0, total, chunk):
        records.sql(_FINISHED, runs=min(chunk, total - start))
    records.sql("ANALYZE")


def timed(scrape: Callable[[], object], repeat: int) -> float:
    """The median of `repeat` timings, after one warm-up."""
    scrape()
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        scrape()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--small", type=int, default=1_000, help="finished runs, first")
    parser.add_argument("--large", type=int, default=100_000, help="finished runs, second")
    parser.add_argument("--repeat", type=int, default=30, help="scrapes timed at each size")
    args = parser.parse_args(argv)

    with scratch.scratch(NAME, REDIS_DB, keep_logs=args.keep_logs) as bench:
        # Lazy: the runtime reads the environment scratch() has just set.
        from prometheus_client import generate_latest

        from pipeline.api.routes.operations import registry_for
        from pipeline.settings import get_settings
        from pipeline.views.metrics import collect

        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="nsbench-metrics-")
        get_settings.cache_clear()
        settings = get_settings()

        def scrape() -> bytes:
            return generate_latest(registry_for(settings))

        records.sql(_UNFINISHED)
        figures = {}
        added = 0
        for size in (args.small, args.large):
            output.log(f"{size:,} finished runs")
            add_finished(size - added)
            added = size
            figures[size] = (timed(scrape, args.repeat), timed(collect, max(3, args.repeat // 5)))
        lines = scrape().decode().count("\n")
        Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).rmdir()

    small, large = figures[args.small], figures[args.large]
    ratio = large[0] / small[0]
    output.print_table(
        f"metrics_scrape: one scrape (median of {args.repeat}), by finished runs kept",
        ["finished runs", "/metrics (prometheus_client)", "baseline: whole-table figures"],
        [
            [f"{args.small:,}", output.ms(small[0]), output.ms(small[1])],
            [f"{args.large:,}", output.ms(large[0]), output.ms(large[1])],
            ["ratio", output.times(ratio), output.times(large[1] / small[1])],
        ],
    )
    output.print_notes(
        bench.machine(),
        f"{args.large:,} vs {args.small:,} runs: {output.verdict(ratio, TARGET)}",
        f"50 unfinished runs and 10 pending approvals both times; the scrape has {lines} lines",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
