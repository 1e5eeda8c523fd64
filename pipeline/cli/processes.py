"""CLI verbs that become a long-running Celery process: a worker, beat and Flower
(this process is replaced by celery's, so signals reach it directly)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import NightshiftError
from pipeline.runs.workers import not_ready
from pipeline.settings import child_environment, get_settings

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand


def _exec_celery(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Replace this process with celery, so signals reach it directly."""
    full = [sys.executable, "-m", "celery", "-A", "pipeline", *argv]
    os.execvpe(full[0], full, child_environment(env))
    return 0  # pragma: no cover - exec does not return


def cmd_worker(args: argparse.Namespace) -> int:
    argv = ["worker", "--hostname", args.name, "--loglevel", args.loglevel, *args.celery_args]
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    # Before celery imports prometheus_client: counters go to files the API's /metrics reads.
    metrics = get_settings().metrics_dir
    metrics.mkdir(parents=True, exist_ok=True)
    return _exec_celery(argv, {"PROMETHEUS_MULTIPROC_DIR": str(metrics)})


def cmd_beat(args: argparse.Namespace) -> int:
    schedule_file = get_settings().data_dir / "celerybeat-schedule"
    schedule_file.parent.mkdir(parents=True, exist_ok=True)
    argv = ["beat", "--loglevel", args.loglevel, "--schedule", str(schedule_file)]
    return _exec_celery([*argv, *args.celery_args])


READY_BEATS = 3
"""A ready file older than this many worker heartbeats is stale: its worker is stuck or gone."""


def cmd_ready(args: argparse.Namespace) -> int:
    """Exit 0 when this host's worker is ready (its heartbeats reach PostgreSQL), 1 with one
    line saying why not: a readiness probe for supervisors and Kubernetes."""
    settings = get_settings()
    path = args.file or settings.ready_file
    why = not_ready(path, READY_BEATS * settings.worker_heartbeat_seconds)
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    print("ready")
    return 0


FLOWER_COLUMNS = "name,kwargs,state,received,runtime,worker"


def cmd_flower(args: argparse.Namespace) -> int:
    auth = get_settings().flower_basic_auth
    if not auth and not args.no_auth:
        raise NightshiftError(
            "Flower would be open to anyone: set NIGHTSHIFT_FLOWER_BASIC_AUTH=user:password "
            "or pass --no-auth explicitly"
        )
    # Through the environment, not argv, so the password does not show in `ps`.
    env = {"FLOWER_BASIC_AUTH": auth} if auth else {}
    argv = [
        "flower",
        f"--address={args.address}",
        f"--port={args.port}",
        # kwargs second: a step's reads "agent, step, run" (pipeline.app.step_kwargs_repr).
        f"--tasks_columns={FLOWER_COLUMNS}",
        *args.celery_args,
    ]
    return _exec_celery(argv, env)


WORKER_AGENTS = (
    " Agents come from the registry (entry points and NIGHTSHIFT_AGENTS), as in every other "
    "process: no -I/--include is needed."
)


def _passes_through(
    command: argparse.ArgumentParser, to: str, example: str, more: str = ""
) -> None:
    """Options this command does not know go to `to` unchanged, in their order."""
    command.set_defaults(passthrough=True, celery_args=[])
    command.epilog = f"Any other option is passed to `{to}` unchanged (e.g. {example}).{more}"


def register(add: AddCommand) -> None:
    worker = add("worker", cmd_worker, "run a Celery worker that executes agent steps")
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument("--concurrency", type=int, help="steps in flight per process")
    worker.add_argument("--name", default="worker@%h", help="node name (%%h: host)")
    _passes_through(worker, "celery worker", "-Q reports, -Ofair", WORKER_AGENTS)

    ready = add(
        "ready", cmd_ready, "exit 0 if this host's worker reaches PostgreSQL (a readiness probe)"
    )
    ready.add_argument(
        "--file", type=Path, help="the worker's ready file (default: NIGHTSHIFT_WORKER_READY_FILE)"
    )

    beat = add("beat", cmd_beat, "run Celery beat: the clock for schedules and the tick")
    beat.add_argument("--loglevel", default="INFO")
    _passes_through(beat, "celery beat", "--max-interval 5")

    flower = add("flower", cmd_flower, "run Flower (basic auth from NIGHTSHIFT_FLOWER_BASIC_AUTH)")
    flower.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 in a container)",
    )
    flower.add_argument("--port", type=int, default=5555)
    flower.add_argument("--no-auth", action="store_true", help="allow an open Flower (local only)")
    _passes_through(flower, "celery flower", "--url_prefix=flower")
