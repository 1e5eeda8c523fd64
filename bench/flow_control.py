"""A night paced under a model provider's rate limits (issue 35's acceptance): a batch of
`--children` one-call children and its synthesis, against the local Messages API limited to
`--rpm` requests, `--itpm` input tokens and `--otpm` output tokens a minute (real 429s with
retry-after past them), with NIGHTSHIFT_MODEL_RATE_LIMITS telling the workers the same limits.

The batch goes as a night's does (a schedule's slot fired by hand, the real fan-out, beat's tick).
Printed: runs failed, the model calls answered and answered 429, and the throughput: the
children's calls a minute from the first to the last (the synthesis's call waits for the
batch's join, and is shown apart), against the limit (the requests limit, or what the
tokens limits allow of this night's calls, whichever binds). The provider's bucket holds
`--burst` seconds of each limit (60: the API's minute), so a night that starts with a full
bucket could run past the limit at first; the steady rate leaves out the first minute.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime

import output
import records
import scratch
from night_scale import check_batch, paced

NAME = "flow_control"
REDIS_DB = 5


def main(argv: list[str] | None = None) -> int:
    parser = output.parser(__doc__)
    parser.add_argument("--children", type=int, default=2000)
    parser.add_argument("--rpm", type=float, default=600.0, help="requests a minute")
    parser.add_argument("--itpm", type=float, default=150_000.0, help="input tokens a minute")
    parser.add_argument("--otpm", type=float, default=60_000.0, help="output tokens a minute")
    parser.add_argument("--burst", type=float, default=60.0, help="the provider's bucket, s")
    parser.add_argument("--latency", type=float, default=0.2, help="the model's, s a call")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=50)
    args = parser.parse_args(argv)
    limits = {"requests_per_minute": args.rpm, "input_tokens_per_minute": args.itpm,
              "output_tokens_per_minute": args.otpm}  # fmt: skip
    with scratch.model_server(args.latency) as model:
        model.rate_limits.set(burst_seconds=args.burst, **limits)
        with scratch.scratch(
            NAME, REDIS_DB, keep_logs=args.keep_logs, model_url=model.url
        ) as bench:
            from pipeline.settings import get_settings, use_environment

            use_environment({
                "NIGHTSHIFT_MODEL_RATE_LIMITS": json.dumps({get_settings().model_name: limits}),
                "NIGHTSHIFT_TICK_SECONDS": "1",
            })  # fmt: skip
            output.log(f"starting {args.processes} worker(s) x{args.threads} threads and beat")
            for i in range(args.processes):
                bench.worker(f"w{i + 1}", concurrency=args.threads)
            bench.beat()
            wall, batch = night(args.children)
            syntheses = check_batch(batch, args.children)
            report(args, bench, model.log.entries(), wall, syntheses)
    return 0


def night(children: int) -> tuple[float, str]:
    from pipeline.runs.schedules import fire
    from pipeline.slots import Missed, Overlap, Schedule

    schedule = Schedule(
        name="bench-flow-control", agent="bench", minute="*",
        params={"children": children, "steps": 1}, missed=Missed.SKIP, overlap=Overlap.ALLOW,
    )  # fmt: skip
    started = time.monotonic()
    decision = fire(schedule.name, now=datetime.now(UTC), schedules=[schedule])
    if decision.batch_id is None:
        raise RuntimeError(f"the slot started no batch: {decision.reason}")
    batch = decision.batch_id

    def finished() -> bool:
        rows = records.sql("SELECT status FROM batches WHERE id = :id", id=batch)
        return bool(rows) and rows[0][0] == "succeeded"

    def done() -> int:
        return int(records.sql(
            "SELECT count(*) FROM runs WHERE batch_id = :id AND status IN "
            "('succeeded', 'failed', 'cancelled')", id=batch)[0][0])  # fmt: skip

    wall = records.wait_for_count(
        paced(finished, done, children + 1), children + 1,
        timeout=600 + children, label="night", started=started,
    )  # fmt: skip
    return wall, batch


def report(
    args: argparse.Namespace,
    bench: scratch.Scratch,
    calls: list[dict],
    wall: float,
    syntheses: int,
) -> None:
    answered = [c for c in calls if c.get("status") == 200]
    refused = [c for c in calls if c.get("status") == 429]
    # The synthesis's call comes after the last child's, once the batch joined: it is no part
    # of the paced calls (a child has one call, so the synthesis's is the last).
    *at, synthesis_at = sorted(datetime.fromisoformat(c["at"]).timestamp() for c in answered)
    span = at[-1] - at[0]
    steady = [t for t in at if t >= at[0] + 60]
    prompt = sum(_prompt(c) for c in answered) / len(answered)
    written = sum(c["usage"]["output_tokens"] for c in answered) / len(answered)
    # The calls a minute each limit allows, for calls the size of this night's.
    allowed = min(args.rpm, args.itpm / prompt, args.otpm / written)
    rate = 60 * (len(at) - 1) / span
    steady_rate = 60 * (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else rate
    failed = records.sql("SELECT count(*) FROM runs WHERE status = 'failed'")[0][0]
    waits = records.sql("SELECT count(*) FROM runs WHERE stop_reason = 'rate_limit'")[0][
        0
    ]  # runs parked now: 0 at the end
    output.print_table(
        f"flow_control: {args.children} children of one call, {args.processes} x "
        f"{args.threads} threads, model {args.latency:g} s",
        ["figure", "value"],
        [
            ("limits a minute (requests / input / output tokens)",
             f"{args.rpm:g} / {args.itpm:g} / {args.otpm:g} (provider's bucket {args.burst:g} s)"),
            ("calls a minute the limits allow (this night's sizes)",
             f"{allowed:.0f} ({prompt:.0f} input, {written:.0f} output tokens a call)"),
            ("runs failed", f"{failed}"),
            ("syntheses", f"{syntheses}"),
            ("model calls answered / answered 429",
             f"{len(answered)} / {len(refused)} ({100 * len(refused) / len(calls):.2f}%)"),
            ("children's calls a minute, first to last",
             f"{rate:.0f} ({100 * rate / allowed:.1f}% of the limit)"),
            ("the same after the first minute",
             f"{steady_rate:.0f} ({100 * steady_rate / allowed:.1f}% of the limit)"),
            ("the synthesis's call after the last child's", output.secs(synthesis_at - at[-1])),
            ("wall (fire to synthesis)", output.secs(wall)),
            ("runs still parked on rate_limit", f"{waits}"),
        ],
    )  # fmt: skip
    output.print_notes(
        bench.machine(),
        "target: no run failed, throughput >= 90% of the limit, < 1% of calls answered 429",
    )


def _prompt(call: dict) -> int:
    usage = call["usage"]
    return sum(int(usage.get(k) or 0) for k in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
