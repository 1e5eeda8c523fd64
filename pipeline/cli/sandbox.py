"""`nightshift sandbox up | down | status`: the local reference services (web, email, pricing,
git host) in the background, for a trial without Docker; `up` prints the export lines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.format import print_json
from pipeline.sandbox import background
from pipeline.sandbox.email import MODES
from pipeline.settings import get_settings

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand


def register(add: AddCommand) -> None:
    command = add(
        "sandbox",
        cmd_sandbox,
        "run the local web, email, pricing and git host services in the background "
        '(eval "$(nightshift sandbox up)" sets their URLs in your shell)',
    )
    command.add_argument("action", choices=["up", "down", "status"])
    command.add_argument(
        "--dir", type=Path, help="logs, pid and URLs (default NIGHTSHIFT_DATA_DIR/sandbox)"
    )
    command.add_argument("--email-mode", choices=MODES, default="keys", help="for up")
    command.add_argument("--json", action="store_true", help="machine-readable status")


def cmd_sandbox(args: argparse.Namespace) -> int:
    dir = (args.dir or get_settings().data_dir / "sandbox").expanduser().resolve()
    if args.action == "down":
        pid = background.stop(dir)
        print("no sandbox was running" if pid is None else f"stopped the sandbox (pid {pid})")
        return 0
    if args.action == "up":
        found = background.status(dir)
        started = background.start(dir, args.email_mode)
        verb = "already running" if found.running else "started"
        # Only the export lines on stdout, so that `eval "$(nightshift sandbox up)"` works.
        print(started.exports(), end="")
        print(
            f"sandbox services {verb} (pid {started.pid}); delivery logs in {dir}\n"
            f'load the URLs into this shell: eval "$(nightshift sandbox up)"  '
            f"(or: source {dir / background.ENV_FILE})",
            file=sys.stderr,
        )
        return 0
    state = background.status(dir)
    if args.json:
        print_json({"dir": str(dir), "running": state.running, "pid": state.pid,
                    "urls": state.urls, "deliveries": state.deliveries})  # fmt: skip
        return 0
    if not state.running:
        print(f"no sandbox runs for {dir} (start it: nightshift sandbox up)")
        return 0
    print(f"sandbox running (pid {state.pid}); delivery logs in {dir}")
    print(state.exports(), end="")
    counted = ", ".join(f"{name} {n}" for name, n in state.deliveries.items())
    print(f"deliveries so far: {counted}")
    return 0
