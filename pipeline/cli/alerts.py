"""`nightshift alerts`: the budget alerts (warning, cap reached, run stopped), newest first,
and whether each one's webhook was delivered."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pipeline.cli.format import print_json, table
from pipeline.views.alerts import list_alerts

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand


def register(add: AddCommand) -> None:
    command = add("alerts", cmd_alerts, "budget alerts, newest first, and their webhooks' delivery")
    command.add_argument("--limit", type=int, default=50)
    command.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_alerts(args: argparse.Namespace) -> int:
    alerts = list_alerts(limit=args.limit)
    if args.json:
        print_json(alerts)
        return 0
    rows = [
        (a["created_at"], a["kind"], a["subject"], a["delivery"], _error(a), a["message"])
        for a in alerts
    ]
    print(table(rows, ["raised", "kind", "subject", "webhook", "last error", "message"]))
    return 0


def _error(alert: dict[str, object]) -> str:
    webhook = alert.get("webhook")
    error = webhook.get("error") if isinstance(webhook, dict) else None
    return str(error)[:80] if error and alert["delivery"] != "confirmed" else ""
