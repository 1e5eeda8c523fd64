"""`nightshift chaos`: real workers, a mixed workload and injected faults; then the proof that
no run was lost or stuck and no side effect happened twice (exit 1 if one was)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from pipeline.chaos.faults import default_weights, parse_weights
from pipeline.chaos.harness import DEFAULT_RATE, ChaosConfig, default_hosts, run_chaos
from pipeline.chaos.hosts import MAX_HOSTS, unavailable
from pipeline.cli.format import print_json
from pipeline.errors import NightshiftError

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand


def register(add: AddCommand) -> None:
    command = add(
        "chaos",
        cmd_chaos,
        "run a workload on real workers while killing, freezing and restarting things; "
        "verify every run and side effect",
    )
    command.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    command.add_argument("--seed", type=int, default=0, help="the fault schedule's seed")
    command.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    command.add_argument(
        "--hosts",
        type=int,
        help="worker hosts (network namespaces, needs root) to spread the workers over and to "
        "partition from PostgreSQL and Redis (default 3 as root, else 0: no partitions)",
    )
    command.add_argument(
        "--faults",
        default=default_weights(),
        help=f"relative weights of the fault kinds (default {default_weights()})",
    )
    command.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        help=f"faults per minute (default {DEFAULT_RATE:g})",
    )
    command.add_argument(
        "--settle", type=float, help="seconds to let runs finish after the last fault"
    )
    command.add_argument(
        "--keep", action="store_true", help="keep the PostgreSQL and Redis data (logs are kept)"
    )
    command.add_argument("--json", action="store_true", help="print the report as JSON")


def cmd_chaos(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.workers < 1 or args.rate <= 0:
        raise NightshiftError("--duration, --workers and --rate must be positive")
    hosts = default_hosts() if args.hosts is None else args.hosts
    if not 0 <= hosts <= MAX_HOSTS:
        raise NightshiftError(f"--hosts must be between 0 and {MAX_HOSTS}")
    if hosts and (why := unavailable()):
        raise NightshiftError(f"--hosts {hosts}: worker hosts are not available here: {why}")
    config = ChaosConfig(
        duration=args.duration,
        seed=args.seed,
        workers=args.workers,
        hosts=hosts,
        weights=parse_weights(args.faults),
        rate=args.rate,
        settle_seconds=args.settle,
        keep=args.keep,
    )

    # The harness reports for itself (faults.txt lists every restart); the runtime's own info
    # lines in this process (each approval, batch, server start) would drown that out.
    logging.getLogger("nightshift").setLevel(logging.WARNING)

    def say(line: str) -> None:
        # With --json, stdout carries the report only; progress goes to stderr.
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    report = run_chaos(config, say)
    if args.json:
        print_json(report.as_dict())
    else:
        print(report.text())
    return 0 if report.passed else 1
