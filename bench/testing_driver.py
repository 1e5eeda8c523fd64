"""How long a user waits for pipeline.testing: the first test of a session, and each further run.

1. The first test: a fresh Python process (as `pytest` is) imports pipeline.testing and runs a
   5-step agent; timed from the process's start to that run's end. Three cases, on an embedded
   server of the benchmark's own (its own temporary directory, as a user's would be):
   - `first ever`: nothing there yet (initdb, the migrations into the template);
   - `server stopped`: the cluster and its template kept, the server stopped (after a reboot,
     or `nightshift services stop`);
   - `server running`: a later session (pipeline.testing leaves the server running).
2. Each further 5-step run in the same process (the database of a finished run emptied for
   the next): wall time and this process's CPU time, median and p90 of --runs runs.

Targets (issue 32): a first test in under 5 s (a later session), a further run under 0.5 s.
With --configured, the runs' databases are made on NIGHTSHIFT_DATABASE_URL's server instead.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import output

TARGET_FIRST = 5.0
TARGET_FURTHER = 0.5

CHILD = r"""
import json, os, sys, time
started = float(sys.argv[1])
runs = int(sys.argv[2])
from pipeline.testing import run_agent
imported = time.time()
from pipeline import Agent, Conversation, ToolContext, text, tool, tool_use

@tool(description="Echo a number.", schema={"type": "object"})
def echo(args, context: ToolContext):
    return {"echo": args.get("n")}

def script(conversation: Conversation):
    step = conversation.assistant_turns()
    if step < 4:
        return [tool_use(step, 0, "echo", {"n": step})]
    return [text("Done after 5 steps.")]

AGENT = Agent(name="five", system="You echo.", instructions="Echo four times.",
              tools=(echo,), input_schema={"type": "object"}, script=script)
run = run_agent(AGENT, {})
assert (run.status, len(run.calls)) == ("succeeded", 4), (run.status, run.error)
first, first_cpu = time.time(), time.process_time()
del run
walls, cpus = [], []
for _ in range(runs):
    wall, cpu = time.perf_counter(), time.process_time()
    run = run_agent(AGENT, {})
    assert run.status == "succeeded"
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
    del run
print(json.dumps({"imported": imported - started, "first": first - started,
                  "first_cpu": first_cpu, "walls": walls, "cpus": cpus}))
"""


def child(tmpdir: Path, runs: int, configured: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")}
    if configured:
        env["NIGHTSHIFT_DATABASE_URL"] = os.environ["NIGHTSHIFT_DATABASE_URL"]
    env["TMPDIR"] = str(tmpdir)
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(started), str(runs)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def stop_server(tmpdir: Path) -> None:
    from pipeline import embedded

    embedded.stop(tmpdir / f"nightshift-testing-{os.getuid()}")


def main() -> None:
    parser = output.parser(__doc__)
    parser.add_argument("--runs", type=int, default=20, help="further runs to time")
    parser.add_argument(
        "--configured", action="store_true", help="on NIGHTSHIFT_DATABASE_URL's server instead"
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    tmpdir = Path(tempfile.mkdtemp(prefix="nightshift-bench-testing-"))
    rows: list[list[str]] = []
    try:
        cases = ["server running"] if args.configured else [
            "first ever", "server stopped", "server running"]  # fmt: skip
        for case in cases:
            if case == "server stopped":
                stop_server(tmpdir)
            output.log(case)
            result = child(tmpdir, args.runs if case == "server running" else 0, args.configured)
            first = result["first"]
            verdict = "met" if first < TARGET_FIRST else "MISSED"
            measured = (f"{first:.2f} s (imports {result['imported']:.2f} s; "
                        f"this process's CPU {result['first_cpu']:.2f} s)")  # fmt: skip
            rows.append([f"first test, {case}", measured, f"< {TARGET_FIRST:g} s", verdict])
        walls, cpus = result["walls"], result["cpus"]
        median = statistics.median(walls)
        verdict = "met" if median < TARGET_FURTHER else "MISSED"
        rows.append([f"further 5-step run (wall, {len(walls)} runs)",
                     f"median {output.ms(median)}, p90 {output.ms(output.percentile(walls, 90))}",
                     f"< {TARGET_FURTHER:g} s", verdict])  # fmt: skip
        rows.append(["further 5-step run (this process's CPU)",
                     f"median {output.ms(statistics.median(cpus))}, "
                     f"p90 {output.ms(output.percentile(cpus, 90))}", "", ""])  # fmt: skip
    finally:
        if not args.configured:
            stop_server(tmpdir)
    output.print_table("pipeline.testing", ["what", "measured", "target", ""], rows)
    output.print_notes(f"load average at the start: {load:.2f} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
