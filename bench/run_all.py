"""Run every benchmark one after another, at reduced sizes (a few minutes in all) or, with
--full, at their defaults. Each runs in its own process and prints its own figures."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent

REDUCED: dict[str, list[str]] = {
    "step_overhead": ["--steps", "100"],
    "batch_throughput": ["--runs", "50"],
    "model_wait": ["--runs", "200"],
    "flat_cost": ["--late", "300", "--old-rows", "200000"],
    "time_to_resume": ["--trials", "2", "--leases", "fast"],
    "metrics_scrape": ["--large", "20000", "--repeat", "10"],
    "live_progress": ["--blocks", "2", "--steps", "20", "--waiters", "20", "--idle", "10"],
    "night_scale": ["--sizes", "200,1000", "--reads-at", "10000,30000", "--repeat", "3"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="default sizes (about 26 minutes)")
    parser.add_argument("--only", default=",".join(REDUCED), help="comma-separated names")
    args = parser.parse_args(argv)
    names = [name for name in args.only.split(",") if name]
    unknown = sorted(set(names) - set(REDUCED))
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(REDUCED)}")

    failed = []
    for name in names:
        options = [] if args.full else REDUCED[name]
        command = [sys.executable, str(BENCH_DIR / f"{name}.py"), *options]
        print(f"\n=== {name} {' '.join(options)}".rstrip(), flush=True)
        started = time.monotonic()
        code = subprocess.run(command, check=False).returncode
        print(f"=== {name}: exit {code} after {time.monotonic() - started:.0f}s", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
