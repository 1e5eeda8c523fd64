"""`nightshift demo`: the nightly report with real workers, one killed, the run resumed. Every
way it ends is one line: done, another demo running, a timeout, Ctrl-C or an error."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.failures import describe
from pipeline.errors import NightshiftError
from pipeline.processes.demo import run_demo
from pipeline.settings import get_settings

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand

INTERRUPTED = 130
"""What a shell reports for a command ended by Ctrl-C (SIGINT)."""


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        return run_demo()
    except KeyboardInterrupt:
        print("nightshift demo: interrupted; stopped what it had started", file=sys.stderr)
        return INTERRUPTED
    except NightshiftError:
        raise  # the command's one line (pipeline/cli/main.py)
    except Exception as exc:
        print(f"nightshift demo: {_in_one_line(exc)}", file=sys.stderr)
        return 2


def _in_one_line(exc: Exception) -> str:
    """The database or broker failure as every command says it; anything else by its type and
    first line, its traceback kept in a file for a bug report."""
    line = describe(exc)
    if line is not None:
        return line
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first} (the traceback is in {_keep_traceback(exc)})"


def _keep_traceback(exc: Exception) -> Path:
    """In the data directory's demo folder, or a temporary file when that is what failed."""
    text = "".join(traceback.format_exception(exc))
    kept = get_settings().data_dir / "demo" / "last-failure.txt"
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(text)
    except OSError:
        handle, name = tempfile.mkstemp(prefix="nightshift-demo-", suffix=".txt")
        with os.fdopen(handle, "w") as file:
            file.write(text)
        kept = Path(name)
    return kept


def register(add: AddCommand) -> None:
    add("demo", cmd_demo, "run the nightly report with real workers, kill one, watch it resume")
