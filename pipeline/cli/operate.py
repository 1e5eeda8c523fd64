"""CLI verbs for operating runs by hand: serve the API, metrics, retention, decisions, cancel,
allow (a changed agent version)."""

from __future__ import annotations

import argparse
import getpass
from datetime import timedelta
from typing import TYPE_CHECKING

import uvicorn

from models import ActionState
from pipeline.api.base import ApiConfig
from pipeline.api.server import create_app, server_config
from pipeline.cli.format import print_json, table
from pipeline.errors import NightshiftError
from pipeline.runs.cancel import cancel_run
from pipeline.runs.decisions import Actor, Decision, decide, retry
from pipeline.runs.retention import CleanupReport, cleanup
from pipeline.runs.versions import allow_version
from pipeline.views.actions import list_actions
from pipeline.views.metrics import as_json, collect, families
from pipeline.views.runs import resolve_run_id

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand
    from pipeline.runs.decisions import DecisionResult


def cmd_api(args: argparse.Namespace) -> int:
    app = create_app(ApiConfig.from_env(insecure_no_auth=args.insecure_no_auth))
    config = server_config(app, args.host, args.port, log_level=args.log_level.lower())
    uvicorn.Server(config).run()
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    metrics = collect()
    if args.json:
        print_json(as_json(metrics))
        return 0
    rows = []
    for family in families(metrics):
        for labels, value in family.samples:
            shown = "-" if value is None else f"{value:.4g}" if isinstance(value, float) else value
            rows.append((family.name, ",".join(f"{k}={v}" for k, v in labels.items()), shown))
    print(table(rows, ["metric", "labels", "value"]))
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    for flag, value in (("--older-than", args.older_than), ("--delete-after", args.delete_after)):
        if value is not None and value < 1:
            raise NightshiftError(f"{flag} must be at least 1 day (got {value:g})")
    report = cleanup(
        _days(args.older_than), dry_run=args.dry_run, delete_after=_days(args.delete_after)
    )
    if args.json:
        print_json(
            {
                "cutoff": report.cutoff,
                "delete_cutoff": report.delete_cutoff,
                "dry_run": report.dry_run,
                "compacted": [c.__dict__ for c in report.compacted],
                "deleted": [d.__dict__ for d in report.deleted],
                "kept": [k.__dict__ for k in report.kept],
            }
        )
        return 0
    _print_compacted(report)
    _print_deleted(report)
    if report.kept:
        print(f"\nopen obligations kept whole (run not deleted): {len(report.kept)} run(s)")
        print(table([(k.run_id, k.agent, k.status, k.reason) for k in report.kept],
                    ["run", "agent", "status", "open"]))  # fmt: skip
    return 0


def _days(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(days=value)


def _print_compacted(report: CleanupReport) -> None:
    verb = "would compact" if report.dry_run else "compacted"
    print(f"{verb} {len(report.compacted)} run(s) finished before {report.cutoff:%Y-%m-%d %H:%M}"
          " (input, result, journal text, settled actions' arguments and results, event"
          " payloads, feed, artifacts)")  # fmt: skip
    if report.compacted:
        rows = [
            (c.run_id, c.agent, c.status, f"{c.finished_at:%Y-%m-%d}", c.journal_entries,
             _kib(c.journal_bytes), c.actions, c.artifacts, _kib(c.artifact_bytes))
            for c in report.compacted
        ]  # fmt: skip
        headers = ["run", "agent", "status", "finished", "journal", "KiB", "actions",
                   "artifacts", "KiB"]  # fmt: skip
        print(table(rows, headers))


def _print_deleted(report: CleanupReport) -> None:
    verb = "would delete" if report.dry_run else "deleted"
    print(f"{verb} {len(report.deleted)} compact record(s) compacted before "
          f"{report.delete_cutoff:%Y-%m-%d %H:%M}")  # fmt: skip
    if report.deleted:
        rows = [(d.run_id, d.agent, d.status, f"{d.compacted_at:%Y-%m-%d}") for d in report.deleted]
        print(table(rows, ["run", "agent", "status", "compacted"]))


def _kib(size: int) -> str:
    return f"{size / 1024:.1f}"


def cmd_actions_list(args: argparse.Namespace) -> int:
    actions = list_actions(state=args.state, limit=args.limit)
    if args.json:
        print_json(actions)
        return 0
    rows = [
        (a["idempotency_key"], a["tool"], a["state"], a["attempts"], a["decision"] or "",
         a["decided_by"] or "", a["run_id"])
        for a in actions
    ]  # fmt: skip
    print(table(rows, ["action", "tool", "state", "attempts", "decision", "by", "run"]))
    return 0


def cmd_actions_resolve(args: argparse.Namespace) -> int:
    verdict = Decision.HAPPENED if args.happened else Decision.DID_NOT_HAPPEN
    return _decide(args.key, verdict, args)


def cmd_actions_retry(args: argparse.Namespace) -> int:
    result = retry(args.key, cli_actor(args.as_name), args.note)
    print(
        f"action {result.action_key}: its failure ({result.error or 'no error recorded'}) is no "
        "longer replayed; the next run that means it does it afresh"
    )
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args.key, "approve", args)


def cmd_reject(args: argparse.Namespace) -> int:
    return _decide(args.key, "reject", args)


def _decide(key: str, decision: str, args: argparse.Namespace) -> int:
    result = decide(key, decision, cli_actor(args.as_name), args.note)
    print(_decided(result))
    return 0


def cli_actor(as_name: str | None) -> Actor:
    """The CLI works on the database directly, as an operator: it records the OS user, or the
    name given with --as, and says which in the audit trail."""
    user = _me()
    if as_name and as_name != user:
        return Actor(as_name, f"cli --as (OS user {user})")
    return Actor(user, "cli (OS user)")


def _decided(result: DecisionResult) -> str:
    what = f"action {result.action_key}: {result.decision} by {result.decided_by}"
    if not result.first:
        return f"{what} was already recorded; nothing changed (state {result.state})"
    return f"{what} recorded; state {result.state}, run {result.run_id} continues"


def cmd_cancel(args: argparse.Namespace) -> int:
    run_id = resolve_run_id(args.run)
    result = cancel_run(run_id, by=cli_actor(args.as_name).identity)
    if result.status.is_terminal():
        print(f"run {run_id} is {result.status}")
    else:
        print(f"run {run_id}: cancel requested; it stops at its next step ({result.status} now)")
    return 0


def cmd_allow(args: argparse.Namespace) -> int:
    run_id = resolve_run_id(args.run)
    allowed = allow_version(run_id, cli_actor(args.as_name), note=args.note)
    print(f"run {run_id}: allowed to go on under agent version {allowed.version}")
    return 0


def register(add: AddCommand) -> None:
    api = add("api", cmd_api, "serve the HTTP API and the status page with uvicorn")
    api.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--log-level", default="info")
    api.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without NIGHTSHIFT_API_TOKEN: anyone who can connect may start, cancel "
        "and approve (trusted machines only; requests must name the bound address, and "
        "changes must send JSON, so web pages cannot)",
    )

    metrics = add("metrics", cmd_metrics, "reliability and usage metrics from the database")
    metrics.add_argument("--json", action="store_true")

    helps = {
        "retention": "redact old finished runs' personal data, delete old compact records "
        "(never an open obligation); beat runs it daily at 04:30 UTC",
        "cleanup": "the same as `nightshift retention`, under its name before records were "
        "also deleted (kept for scripts that call it)",
    }
    for name, help in helps.items():
        retention = add(name, cmd_retention, help)
        retention.add_argument(
            "--dry-run", action="store_true", help="only list what would be redacted and deleted"
        )
        retention.add_argument(
            "--older-than",
            type=float,
            metavar="DAYS",
            help="finished before; default NIGHTSHIFT_RETENTION_DAYS or 30",
        )
        retention.add_argument(
            "--delete-after",
            type=float,
            metavar="DAYS",
            help="after compaction; default NIGHTSHIFT_RETENTION_DELETE_DAYS or 365",
        )
        retention.add_argument("--json", action="store_true")

    actions = add(
        "actions", _usage, "list side effects, resolve an unknown outcome, or retry a failure"
    )
    verbs = actions.add_subparsers(dest="actions_command", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="actions, newest first")
    listing.set_defaults(handler=cmd_actions_list)
    listing.add_argument("--state", choices=[s.value for s in ActionState])
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true")
    resolve = verbs.add_parser(
        "resolve", help="say whether an action with an unknown outcome happened"
    )
    resolve.set_defaults(handler=cmd_actions_resolve)
    resolve.add_argument("key", help="the action's idempotency key")
    verdict = resolve.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--happened", action="store_true", help="it happened: do not resend")
    verdict.add_argument(
        "--did-not-happen", action="store_true", help="it did not happen: send it (once)"
    )
    _by_and_note(resolve)
    retrying = verbs.add_parser(
        "retry", help="stop replaying a failed action's failure: the next run does it afresh"
    )
    retrying.set_defaults(handler=cmd_actions_retry)
    retrying.add_argument("key", help="the failed action's idempotency key")
    _as(retrying, "who retries")
    retrying.add_argument("--note", help="what was fixed, in a few words")

    for name, handler, what in (
        ("approve", cmd_approve, "approve an action waiting for approval"),
        ("reject", cmd_reject, "reject an action waiting for approval"),
    ):
        command = add(name, handler, what)
        command.add_argument("key", help="the action's idempotency key")
        _by_and_note(command)

    cancel = add("cancel", cmd_cancel, "cancel a run (a waiting run now, a running one next step)")
    cancel.add_argument("run", help="run id, or its first characters (at least 4)")
    _as(cancel, "who cancels")

    allow = add("allow", cmd_allow, "let a run parked on a changed agent version go on under it")
    allow.add_argument("run", help="run id, or its first characters (at least 4)")
    _by_and_note(allow)


def _by_and_note(command: argparse.ArgumentParser) -> None:
    _as(command, "who decides")
    command.add_argument("--note", help="why, in a few words")


def _as(command: argparse.ArgumentParser, who: str) -> None:
    command.add_argument(
        "--as",
        "--by",
        dest="as_name",
        metavar="NAME",
        help=f"{who} (default: your OS user name; the audit trail records both)",
    )


def _me() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def _usage(args: argparse.Namespace) -> int:  # pragma: no cover - argparse requires a verb
    raise NightshiftError("actions needs a verb: list, resolve or retry")
