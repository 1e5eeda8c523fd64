"""`nightshift tokens create --for NAME | list | revoke ID`: per-person tokens for the API, the
status page and the approval webhook. A token is printed once; only its hash is kept."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import TYPE_CHECKING

from pipeline.api.tokens import create_token, list_tokens, revoke_token
from pipeline.cli.format import print_json, table
from pipeline.cli.operate import cli_actor

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand


def register(add: AddCommand) -> None:
    command = add("tokens", cmd_tokens, "create, list or revoke a person's API token")
    verbs = command.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = verbs.add_parser("create", help="a new token for a person; printed once")
    create.add_argument(
        "--for", dest="identity", required=True, metavar="NAME",
        help="whom the token speaks for, e.g. pricing@acme.example (matched against approvers)",
    )  # fmt: skip
    create.add_argument("--note", help="what it is for, e.g. 'the pricing team's chat bot'")
    listing = verbs.add_parser("list", help="tokens by prefix, with who and when last used")
    listing.add_argument("--all", action="store_true", help="revoked tokens too")
    revoke = verbs.add_parser("revoke", help="stop a token (and its sessions) at once")
    revoke.add_argument("token", help="the token's id or prefix (from `nightshift tokens list`)")
    for verb in (create, listing, revoke):
        verb.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_tokens(args: argparse.Namespace) -> int:
    operator = cli_actor(None).identity
    if args.verb == "create":
        issued = create_token(args.identity, created_by=operator, note=args.note)
        if args.json:
            print_json({"id": issued.id, "identity": issued.identity, "token": issued.token})
            return 0
        print(f"token for {issued.identity} (id {issued.id}); shown this once, keep it secret:")
        print(issued.token)
        return 0
    if args.verb == "revoke":
        info = revoke_token(args.token, by=operator)
        if args.json:
            print_json(asdict(info))
        else:
            print(f"token {info.prefix} for {info.identity} revoked at {info.revoked_at:%c}")
        return 0
    tokens = list_tokens(include_revoked=args.all)
    if args.json:
        print_json([asdict(t) for t in tokens])
        return 0
    rows = [
        (t.prefix, t.identity, f"{t.created_at:%Y-%m-%d}", t.created_by,
         f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never",
         f"revoked {t.revoked_at:%Y-%m-%d}" if t.revoked_at else "active", t.note or "")
        for t in tokens
    ]  # fmt: skip
    print(table(rows, ["token", "for", "created", "by", "last used", "state", "note"]))
    return 0
