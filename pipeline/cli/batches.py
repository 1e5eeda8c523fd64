"""`nightshift batches list | show ID`: a night's fan-out at a glance, children done / running
/ waiting / failed with a progress bar, the synthesis and the approvals it waits for."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pipeline.cli.format import print_json, progress_bar, table
from pipeline.views.batches import PendingApproval, list_batches, show_batch

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand
    from pipeline.views.batches import BatchProgress


def register(add: AddCommand) -> None:
    command = add("batches", cmd_batches, "list batches, or show one batch's progress")
    verbs = command.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="batches, newest first, with their progress")
    listing.add_argument("--limit", type=int, default=20)
    show = verbs.add_parser(
        "show", help="one batch: children by status, synthesis, pending approvals"
    )
    show.add_argument("id", help="the batch id, e.g. competitor-monitor:2026-11-30T07:00:00+00:00")
    for verb in (listing, show):
        verb.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_batches(args: argparse.Namespace) -> int:
    return cmd_show(args) if args.verb == "show" else cmd_list(args)


def cmd_list(args: argparse.Namespace) -> int:
    batches = list_batches(limit=args.limit)
    if args.json:
        print_json([b.as_json() for b in batches])
        return 0
    rows = [
        (
            b.id,
            b.name,
            _status(b),
            progress_bar(b.children.finished, b.children.total, width=20),
            b.children.done,
            b.children.running,
            b.children.waiting,
            b.children.failed,
            b.synthesis_status or "-",
            len(b.pending_approvals),
        )
        for b in batches
    ]
    headers = ["batch", "job", "status", "children finished", "done", "running", "waiting",
               "failed", "synthesis", "approvals"]  # fmt: skip
    print(table(rows, headers))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    batch = show_batch(args.id)
    if args.json:
        print_json(batch.as_json())
        return 0
    print("\n".join(describe(batch)))
    return 0


def describe(batch: BatchProgress) -> list[str]:
    c = batch.children
    finished = f"finished {batch.finished_at:%Y-%m-%d %H:%M:%S %Z}" if batch.finished_at else ""
    lines = [
        f"batch {batch.id}",
        f"job {batch.name}  status {_status(batch)}  "
        f"created {batch.created_at:%Y-%m-%d %H:%M:%S %Z}  {finished}".rstrip(),
        f"children {progress_bar(c.finished, c.total)} finished",
        f"  done {c.done}  running {c.running}  waiting {c.waiting}  failed {c.failed}",
        f"tokens {c.tokens}" + (f" of a {batch.token_cap} cap" if batch.token_cap else ""),
        f"synthesis {_synthesis(batch)}",
        f"pending approvals {len(batch.pending_approvals)}",
    ]
    lines += [_pending(a) for a in batch.pending_approvals]
    if batch.pending_approvals:
        lines.append(
            "  decide with: nightshift approve KEY --as APPROVER  |  "
            "nightshift reject KEY --as APPROVER --note WHY"
        )
    return lines


def _pending(approval: PendingApproval) -> str:
    who = f"  by {', '.join(approval.approvers)}" if approval.approvers else ""
    return f"  {approval.key}  ({approval.tool} {_args(approval.args)}){who}"


def _status(batch: BatchProgress) -> str:
    return f"{batch.status} ({batch.stop_reason})" if batch.stop_reason else str(batch.status)


def _synthesis(batch: BatchProgress) -> str:
    if batch.synthesis_run_id is None:
        unfinished = batch.children.total - batch.children.finished
        if batch.status.is_terminal():
            return "not started (the batch ended first)"
        return f"not started (waits for {unfinished} more child run(s))"
    waiting = f" on {batch.synthesis_waiting_on}" if batch.synthesis_waiting_on else ""
    return f"{batch.synthesis_status}{waiting}  run {batch.synthesis_run_id}"


def _args(args: dict[str, object]) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in args.items() if k != "reason")
    return shown[:120]
