"""The `nightshift` command: one entry point for operators and developers. This module only
dispatches: each command module adds its verbs with `register(add)`, in the order `--help`
lists them."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

import pipeline.tracing as tracing
from pipeline.cli.failures import LONG_RUNNING, describe, stop_what_this_command_started
from pipeline.errors import NightshiftError
from pipeline.logs import safe_log_lines

Handler = Callable[[argparse.Namespace], int]
AddCommand = Callable[[str, Handler, str], argparse.ArgumentParser]

COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    # module: the commands its register() adds, in --help's order. Only the module of the
    # command being run is imported (`nightshift agents` need not import FastAPI).
    "pipeline.cli.demo": ("demo",),
    "pipeline.cli.services": ("services", "migrate"),
    "pipeline.cli.processes": ("worker", "ready", "beat", "flower"),
    "pipeline.cli.runs": ("start", "runs", "show", "tick"),
    "pipeline.cli.agents": ("agents",),
    "pipeline.cli.check": ("check",),
    "pipeline.cli.schedules": ("schedules",),
    "pipeline.cli.operate": (
        "api", "metrics", "retention", "cleanup", "actions", "approve", "reject", "cancel", "allow",
    ),
    "pipeline.cli.tokens": ("tokens",),
    "pipeline.cli.batches": ("batches",),
    "pipeline.cli.alerts": ("alerts",),
    "pipeline.cli.watch": ("watch",),
    "pipeline.cli.chaos": ("chaos",),
    "pipeline.cli.sandbox": ("sandbox",),
}  # fmt: skip


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: with a known command first, only that command's module is
    imported; otherwise (`--help`, a typo) every command, so argparse can list them all."""
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

    for module in _modules_for(sys.argv[1:] if argv is None else argv):
        importlib.import_module(module).register(add)
    return parser


def _modules_for(argv: Sequence[str]) -> list[str]:
    first = argv[0] if argv else None
    owner = [module for module, names in COMMAND_MODULES.items() if first in names]
    return owner or list(COMMAND_MODULES)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser(argv)
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
    safe_log_lines()
    args = parse(argv)
    if args.command not in LONG_RUNNING:  # the closing line says what was started and stopped
        logging.getLogger("nightshift.embedded").setLevel(logging.WARNING)
    try:
        tracing.configure()  # runs it starts are traced as the OTEL_* variables say
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
