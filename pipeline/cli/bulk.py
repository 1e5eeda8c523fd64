"""`nightshift runs bulk KIND --filter...`: cancel, retry, approve or reject by filter. A dry
run unless --apply; applied, one audited operation that a worker carries out (and the tick
takes up again if that worker dies). `nightshift runs bulk show [OPERATION]` follows it."""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from models import BulkKind
from pipeline.cli.format import print_json, table
from pipeline.cli.operate import cli_actor
from pipeline.errors import NightshiftError
from pipeline.runs import bulk
from pipeline.runs.bulk_filter import BulkFilter
from pipeline.views.bulk import bulk_operation, parse_operation_id, recent_bulk_operations

FILTERS = ("agent", "batch", "status", "stop_reason", "started_after", "started_before",
           "waiting_on")  # fmt: skip
WAIT_POLL_SECONDS = 0.5


def cmd_bulk(args: argparse.Namespace) -> int:
    if args.kind == "show":
        return _show(args)
    if args.operation is not None:
        raise NightshiftError(f"runs bulk {args.kind} takes filters, not an operation id")
    wanted = BulkFilter.parse({name: getattr(args, name) for name in FILTERS})
    if not args.apply:
        found = bulk.preview(args.kind, wanted)
        if args.json:
            print_json({**found.as_json(), "dry_run": True})
            return 0
        what = "approval(s)" if found.kind.on_actions() else "run(s)"
        print(f"dry run: {found.kind} would act on {len(found.items)} {what} matching "
              f"{_words(wanted)}")  # fmt: skip
        for item in found.items[: bulk.DRY_RUN_IDS_SHOWN]:
            print(f"  {item.run_id}" + (f"  {item.action_key}" if item.action_key else ""))
        if len(found.items) > bulk.DRY_RUN_IDS_SHOWN:
            print(f"  ... and {len(found.items) - bulk.DRY_RUN_IDS_SHOWN} more")
        if found.items:
            print(f"nothing changed; add --apply to {found.kind} them as one audited operation")
        return 0
    created = bulk.create(args.kind, wanted, cli_actor(args.as_name), args.note)
    if args.json and not args.wait:
        print_json(created.as_json())
        return 0
    if not args.json:
        print(f"bulk {created.kind} {created.operation_id}: {len(created.items)} item(s); "
              f"follow it with `nightshift runs bulk show {created.operation_id}`")  # fmt: skip
    if args.wait:
        return _follow(created.operation_id, args.json)
    return 0


def _words(wanted: BulkFilter) -> str:
    return " ".join(f"{name}={value}" for name, value in wanted.as_json().items())


def _show(args: argparse.Namespace) -> int:
    if args.operation is None:
        operations = recent_bulk_operations()
        if args.json:
            print_json(operations)
            return 0
        lines = [(o["id"], o["kind"], f"{o['done']}/{o['total']}", o["requested_by"],
                  o["created_at"][:19], "finished" if o["finished_at"] else "in progress")
                 for o in operations]  # fmt: skip
        print(table(lines, ["operation", "kind", "done", "by", "created", "state"]))
        return 0
    shown = bulk_operation(parse_operation_id(args.operation))
    if args.json:
        print_json(shown)
        return 0
    _print_operation(shown)
    return 0


def _print_operation(shown: dict[str, Any]) -> None:
    state = "finished" if shown["finished_at"] else "in progress"
    counts = ", ".join(f"{count} {outcome}" for outcome, count in sorted(shown["outcomes"].items()))
    print(f"bulk {shown['kind']} {shown['id']}: {shown['done']}/{shown['total']} done, {state}"
          f"{f' ({counts})' if counts else ''}")  # fmt: skip
    print(f"by {shown['requested_by']} ({shown['via']}) at {shown['created_at'][:19]}, filter "
          f"{' '.join(f'{k}={v}' for k, v in shown['filter'].items())}")  # fmt: skip
    for item in shown.get("items", []):
        print(f"  {item['run_id']}  {item['outcome'] or '-':<8} {item['detail'] or ''}")


def _follow(operation_id: uuid.UUID, as_json: bool) -> int:
    """Until a worker finished it; the operation goes on whether anyone follows or not."""
    while True:
        shown = bulk_operation(operation_id, items=False)
        if shown["finished_at"]:
            break
        time.sleep(WAIT_POLL_SECONDS)
    shown = bulk_operation(operation_id)
    if as_json:
        print_json(shown)
    else:
        _print_operation(shown)
    return 0


def register_verb(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kinds = [kind.value for kind in BulkKind]
    parser = verbs.add_parser(
        "bulk",
        help="cancel, retry (failed runs), approve or reject (pending approvals) every run a "
        "filter matches: a dry run unless --apply; `runs bulk show [OP]` shows progress",
    )
    parser.add_argument("kind", choices=[*kinds, "show"], help="what to do, or show")
    parser.add_argument("operation", nargs="?", help="with show: the operation's id")
    parser.add_argument("--agent")
    parser.add_argument("--batch")
    parser.add_argument("--status", help="a run status: failed, waiting, running...")
    parser.add_argument("--stop-reason", dest="stop_reason", help="e.g. unknown_agent, deadline")
    instant = "an ISO-8601 time with a timezone: runs created"
    parser.add_argument("--started-after", dest="started_after", help=f"{instant} at or after it")
    parser.add_argument("--started-before", dest="started_before", help=f"{instant} before it")
    parser.add_argument("--waiting-on", dest="waiting_on",
                        help="a kind of wait: approval, timer, model, ...")  # fmt: skip
    parser.add_argument("--note", help="the reason: a cancellation's, a decision's note")
    parser.add_argument("--as", dest="as_name", help="decide as this approver (recorded with "
                        "your OS user in the audit trail)")  # fmt: skip
    parser.add_argument(
        "--apply", action="store_true", help="do it (without: a dry run, which changes nothing)"
    )
    parser.add_argument(
        "--wait", action="store_true", help="with --apply: wait until a worker finished it"
    )
    parser.add_argument("--json", action="store_true")
