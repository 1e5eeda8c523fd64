"""The `nightshift` command: one entry point for operators and developers."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import pipeline.embedded as embedded
from pipeline.cli.failures import LONG_RUNNING, describe, stop_what_this_command_started
from pipeline.cli.format import print_json, table
from pipeline.cli.waiting import wait_and_report
from pipeline.errors import NightshiftError, redact_url
from pipeline.local.demo import run_demo
from pipeline.migrate import current, upgrade
from pipeline.registry import get_agent
from pipeline.runs.deadlines import parse_deadline
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.settings import get_settings
from pipeline.views.liveness import QueueLiveness, queue_liveness, stall
from pipeline.views.runs import list_runs, resolve_run_id, show_run

Handler = Callable[[argparse.Namespace], int]
AddCommand = Callable[[str, Handler, str], argparse.ArgumentParser]

# Each module adds its verbs with `register(add: AddCommand)`.
COMMAND_MODULES: tuple[str, ...] = (
    "pipeline.cli.agents",
    "pipeline.cli.schedules",
    "pipeline.cli.operate",
    "pipeline.cli.tokens",
    "pipeline.cli.batches",
    "pipeline.cli.watch",
    "pipeline.cli.chaos",
    "pipeline.cli.sandbox",
)


# -- services -------------------------------------------------------------------------------


def cmd_services(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.action == "up":
        if not settings.embedded:
            print("NIGHTSHIFT_DATABASE_URL and NIGHTSHIFT_BROKER_URL are set: nothing to start.")
            return 0
        embedded.ensure_running(
            settings.data_dir,
            postgres=settings.database_url is None,
            redis=settings.broker_url is None,
        )
    elif args.action == "down":
        stopped = embedded.stop(settings.data_dir)
        for info in stopped:
            print(f"stopped {info.name} (pid {info.pid})")
        if not stopped:
            print("nothing was running")
        return 0
    # Shown without the passwords: they stay in their files (DATA_DIR/secrets/, mode 0600).
    infos = [
        replace(i, url=redact_url(i.url) if i.url else None)
        for i in embedded.status(settings.data_dir)
    ]
    if args.json:
        print_json([info.__dict__ for info in infos])
        return 0
    rows = [
        (i.name, "running" if i.running else "stopped", i.pid, i.url or "", i.data_path)
        for i in infos
    ]
    print(f"data directory: {settings.data_dir} (passwords in {settings.data_dir / 'secrets'})")
    print(table(rows, ["service", "state", "pid", "url", "data"]))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    upgrade()
    print(f"database schema at revision {current()}")
    return 0


# -- processes ------------------------------------------------------------------------------


def _exec_celery(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Replace this process with celery, so signals reach it directly."""
    full = [sys.executable, "-m", "celery", "-A", "pipeline", *argv]
    os.execvpe(full[0], full, {**os.environ, **(env or {})})
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


def cmd_flower(args: argparse.Namespace) -> int:
    auth = get_settings().flower_basic_auth
    if not auth and not args.no_auth:
        raise NightshiftError(
            "Flower would be open to anyone: set NIGHTSHIFT_FLOWER_BASIC_AUTH=user:password "
            "or pass --no-auth explicitly"
        )
    # Through the environment, not argv, so the password does not show in `ps`.
    env = {"FLOWER_BASIC_AUTH": auth} if auth else {}
    argv = ["flower", f"--address={args.address}", f"--port={args.port}", *args.celery_args]
    return _exec_celery(argv, env)


# -- runs -----------------------------------------------------------------------------------


def cmd_start(args: argparse.Namespace) -> int:
    try:
        run_input = json.loads(args.input)
    except json.JSONDecodeError as exc:
        raise NightshiftError(f"--input is not valid JSON: {exc}") from None
    deadline = parse_deadline(args.deadline, "--deadline")
    if args.timeout is not None and (not args.wait or args.timeout <= 0):
        raise NightshiftError("--timeout needs --wait and a positive number of seconds")
    started = start_run(
        args.agent, run_input, args.key, deadline=deadline, notify_url=args.notify_url
    )
    _warn_unset_needs(args.agent)
    if args.json:
        if not args.wait:  # with --wait, the outcome is the one JSON document
            print_json({"run_id": str(started.run_id), "created": started.created})
    elif started.created:
        print(f"started run {started.run_id}", flush=True)
    else:
        print(f"key {args.key!r} already started run {started.run_id}; nothing new started")
    if args.wait:
        return wait_and_report(started.run_id, args.timeout, args.json)
    return 0


def _warn_unset_needs(agent: str) -> None:
    """The workers' environment decides; this shell's is a good guess of it on a trial."""
    unset = get_agent(agent).unset_needs(get_settings().is_set)
    if unset:
        names = " and ".join(dict.fromkeys(variable for variable, _ in unset))
        print(
            f"note: {names} not set here; a worker without them fails the run at once with "
            'reason config (for a trial: eval "$(nightshift sandbox up)")',
            file=sys.stderr,
        )


def cmd_runs(args: argparse.Namespace) -> int:
    rows = list_runs(status=args.status, agent=args.agent, batch=args.batch, limit=args.limit)
    if args.json:
        print_json(rows)
        return 0
    lines = [
        (r["id"], r["agent"], r["status"], r["step"], r["stop_reason"], r["updated_at"])
        for r in rows
    ]
    print(table(lines, ["run", "agent", "status", "step", "reason", "updated"]))
    for note in _stall_notes(rows, queue_liveness()):
        print(f"note: {note}")
    return 0


def _stall_notes(rows: list[dict[str, Any]], liveness: QueueLiveness) -> list[str]:
    """What keeps the listed running runs from moving: no worker at all, or no claim."""
    settings = get_settings()
    running = [r for r in rows if r["status"] == "running"]
    if not running:
        return []
    nobody = liveness.no_worker()
    if nobody is not None:
        return [f"{nobody}; {len(running)} running run(s) listed here wait for it"]
    notes = []
    for row in running:
        updated = datetime.fromisoformat(row["updated_at"])
        why = stall("running", row["lease_owner"], updated, liveness, settings)
        if why is not None:
            notes.append(f"run {row['id'][:8]} is {why}")
    return notes


def cmd_show(args: argparse.Namespace) -> int:
    detail = show_run(resolve_run_id(args.run))
    if args.json:
        print_json(detail)
        return 0
    run = detail["run"]
    print(f"run {run['id']}  agent {run['agent']}  status {run['status']}  step {run['step']}")
    print(
        f"tokens in/out {run['input_tokens']}/{run['output_tokens']}  cache write/read "
        f"{run['cache_creation_input_tokens']}/{run['cache_read_input_tokens']}  cost "
        f"${run['cost_usd']:.4f}  tool calls {run['tool_calls']}  attempts {run['attempt']}  "
        f"reason {run['stop_reason'] or '-'}"
    )
    if run["error"]:
        print(f"error: {run['error']}")
    updated = datetime.fromisoformat(run["updated_at"])
    why = stall(run["status"], run["lease_owner"], updated, queue_liveness(), get_settings())
    if why is not None:
        print(f"note: this run is {why}" if why.startswith("runnable") else f"note: {why}")
    print("\ntimeline:")
    for entry in detail["journal"]:
        when = entry["created_at"][11:19]
        print(f"  {when}  step {entry['step']:>3}  {entry['key']:<28} {entry['summary']}")
    if detail["actions"]:
        print("\nactions:")
        for action in detail["actions"]:
            key, state = action["idempotency_key"], action["state"]
            print(f"  {key:<40} {state:<16} attempts {action['attempts']}")
    return 0


def cmd_tick(args: argparse.Namespace) -> int:
    report = tick()
    print(
        f"resumed {len(report.resumed)} run(s), woke {len(report.woken)} run(s), "
        f"ended {len(report.expired)} waiting run(s) past their deadline"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo()


# -- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nightshift",
        description="Durable AI-agent runs on Celery. With no NIGHTSHIFT_DATABASE_URL and "
        "NIGHTSHIFT_BROKER_URL set, an embedded PostgreSQL and Redis are started in "
        "NIGHTSHIFT_DATA_DIR.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help, description=help)
        command.set_defaults(handler=handler)
        return command

    demo = add(
        "demo", cmd_demo, "run the nightly report with real workers, kill one, watch it resume"
    )
    demo.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")

    services = add(
        "services", cmd_services, "start, stop or show the embedded PostgreSQL and Redis"
    )
    services.add_argument("action", choices=["up", "down", "status"])
    services.add_argument("--json", action="store_true", help="machine-readable output")

    add("migrate", cmd_migrate, "upgrade the database schema to the latest revision")

    for name, handler, what in (
        ("worker", cmd_worker, "run a Celery worker that executes agent steps"),
        ("beat", cmd_beat, "run Celery beat: the clock for schedules and the tick"),
    ):
        command = add(name, handler, what)
        command.add_argument("--loglevel", default="INFO")
        if name == "worker":
            command.add_argument("--concurrency", type=int, help="steps in flight per process")
            command.add_argument("--name", default="worker@%h", help="node name (%%h: host)")
        if name == "worker":
            _passes_through(command, "celery worker", "-Q reports, -Ofair", WORKER_AGENTS)
        else:
            _passes_through(command, "celery beat", "--max-interval 5")

    flower = add("flower", cmd_flower, "run Flower (basic auth from NIGHTSHIFT_FLOWER_BASIC_AUTH)")
    flower.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 in a container)",
    )
    flower.add_argument("--port", type=int, default=5555)
    flower.add_argument("--no-auth", action="store_true", help="allow an open Flower (local only)")
    _passes_through(flower, "celery flower", "--url_prefix=flower")

    start = add("start", cmd_start, "start a run of AGENT with a JSON input")
    start.epilog = "`nightshift agents` lists the registered agents and the input each accepts."
    start.add_argument("agent", help="a registered agent's name (see `nightshift agents`)")
    start.add_argument(
        "--input", required=True, help='the run input as JSON, e.g. \'{"team": "ops"}\''
    )
    start.add_argument("--key", help="idempotency key: the same key never starts a second run")
    start.add_argument(
        "--deadline",
        help="finish by then or stop with reason deadline (waiting runs too): seconds, a "
        "duration like 15m or 2h, or an ISO-8601 time with a timezone",
    )
    start.add_argument(
        "--notify-url",
        help="POST a signed event there when the run finishes or waits for a person",
    )
    start.add_argument(
        "--wait",
        action="store_true",
        help="wait for the outcome and print it; exit 0 if the run succeeded, 1 if it failed "
        "or was cancelled, 3 if it waits for a person, 4 if --timeout passed first",
    )
    start.add_argument("--timeout", type=float, help="with --wait: give up after S seconds")
    start.add_argument("--json", action="store_true")

    runs = add("runs", cmd_runs, "list runs, newest first")
    runs.add_argument("--status")
    runs.add_argument("--agent")
    runs.add_argument("--batch")
    runs.add_argument("--limit", type=int, default=50)
    runs.add_argument("--json", action="store_true")

    show = add("show", cmd_show, "show a run: status, usage, journal timeline and actions")
    show.add_argument("run", help="run id, or its first characters (at least 4)")
    show.add_argument("--json", action="store_true")

    add(
        "tick",
        cmd_tick,
        "resume orphaned runs, wake due timers and end waiting runs past their deadline once "
        "(beat does this)",
    )
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(add)
    return parser


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


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:
        args.celery_args = [arg for arg in unknown if arg != "--"]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger("nightshift").setLevel(logging.INFO)
    args = parse(argv)
    if args.command not in LONG_RUNNING:  # the closing line says what was started and stopped
        logging.getLogger("nightshift.embedded").setLevel(logging.WARNING)
    try:
        return int(args.handler(args))
    except NightshiftError as exc:
        print(f"nightshift: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader stopped early (`nightshift runs | head`): nothing went wrong here. Point
        # stdout at /dev/null so that the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a command ended by SIGPIPE
    except Exception as exc:
        line = describe(exc)
        if line is None:
            raise
        print(f"nightshift: {line}", file=sys.stderr)
        return 2
    finally:
        stop_what_this_command_started(args.command)
