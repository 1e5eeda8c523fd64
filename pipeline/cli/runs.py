"""CLI verbs for runs: start one (and wait for its outcome), list them, retry or fork one, act on
many by filter (cli/bulk.py), show one, tick once."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from datetime import datetime
from textwrap import indent
from typing import TYPE_CHECKING, Any

from pipeline.api.words import action_words
from pipeline.cli.bulk import cmd_bulk, register_verb
from pipeline.cli.failures import following
from pipeline.cli.format import print_json, table
from pipeline.cli.setting_hints import where_to_set
from pipeline.cli.waiting import wait_and_report
from pipeline.errors import NightshiftError
from pipeline.registry import get_agent
from pipeline.runs.deadlines import parse_deadline
from pipeline.runs.fork import fork_run
from pipeline.runs.retry import retry_run
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.settings import get_settings
from pipeline.views.liveness import QueueLiveness, queue_liveness, stall
from pipeline.views.outages import model_outages
from pipeline.views.runs import list_runs, resolve_run_id, show_run
from pipeline.views.turns import waiting_for_turns

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand


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
    if not args.wait:
        return 0
    with following("run", started.run_id):
        return wait_and_report(started.run_id, args.timeout, args.json)


def _warn_unset_needs(agent: str) -> None:
    """The workers' environment decides; this shell's is a good guess of it on a trial."""
    unset = get_agent(agent).unset_needs(get_settings().is_set)
    variables = list(dict.fromkeys(variable for variable, _ in unset))
    if variables:
        print(
            f"note: {' and '.join(variables)} not set here; a worker without them fails the run "
            "at once with reason config",
            file=sys.stderr,
        )
    for variable in variables:
        print(f"  {variable}: {where_to_set(variable)}", file=sys.stderr)


def cmd_runs(args: argparse.Namespace) -> int:
    if args.verb == "retry":
        return cmd_retry(args)
    if args.verb == "fork":
        return cmd_fork(args)
    if args.verb == "bulk":
        return cmd_bulk(args)
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
    for outage in model_outages(get_settings()):
        print(f"note: {outage.describe()}")
    for waiting in waiting_for_turns():
        print(f"note: {waiting}")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    origin = resolve_run_id(args.run)
    retry = retry_run(origin, by=_os_user())
    started = retry.started
    if args.json:
        print_json({"run_id": str(started.run_id), "created": started.created,
                    "retry_of": str(origin)})  # fmt: skip
    elif started.created:
        print(f"started run {started.run_id}, a retry of run {origin}")
    else:
        print(f"run {origin} was already retried as run {started.run_id}; nothing new started "
              "(retry that one if it failed too)")  # fmt: skip
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    origin = resolve_run_id(args.run)
    fork = fork_run(origin, args.from_step, by=_os_user())
    started = fork.started
    if args.json:
        print_json({"run_id": str(started.run_id), "created": started.created,
                    "fork_of": str(origin), "from_step": fork.step})  # fmt: skip
    elif started.created:
        print(f"started run {started.run_id}, a fork of run {origin} from step {fork.step}")
    else:
        print(f"run {origin} was already forked from step {fork.step} as run "
              f"{started.run_id}; nothing new started")  # fmt: skip
    return 0


def _os_user() -> str:
    try:
        return f"cli (OS user {getpass.getuser()})"
    except (KeyError, OSError):
        return "cli"


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


def failed_attempts_line(run: dict[str, Any]) -> str | None:
    """Attempts are shown only when one failed: `runs.attempt` counts every claim, one per step
    when nothing goes wrong, so on its own it reads like crashes that never happened."""
    if not run["failed_attempts"]:
        return None
    step, failed = run["failed_step"], run["failed_attempts"]
    counting = " (counted towards max_step_attempts)" if step == run["step"] else ""
    return f"failed attempts of step {step}: {failed}{counting}; claims in all: {run['attempt']}"


def cmd_show(args: argparse.Namespace) -> int:
    detail = show_run(resolve_run_id(args.run))
    if args.json:
        print_json(detail)
        return 0
    run = detail["run"]
    print(f"run {run['id']}  agent {run['agent']}  status {run['status']}  step {run['step']}")
    print(f"agent version: {run['version']}")
    print(
        f"tokens in/out {run['input_tokens']}/{run['output_tokens']}  cache write/read "
        f"{run['cache_creation_input_tokens']}/{run['cache_read_input_tokens']}  cost "
        f"${run['cost_usd']:.4f}  tool calls {run['tool_calls']}  "
        f"reason {run['stop_reason'] or '-'}"
    )
    if (attempts := failed_attempts_line(run)) is not None:
        print(attempts)
    if run["error"]:
        print(f"error: {run['error']}")
    if run["retry_of"]:
        print(f"retry of run {run['retry_of']}")
    if run["retried_as"]:
        chain = ", then ".join(f"{r['id']} ({r['status']})" for r in run["retried_as"])
        print(f"retried as run {chain}")
    if run["fork_of"]:
        print(f"fork of run {run['fork_of']['id']} from step {run['fork_of']['from_step']}")
    for fork in run["forks"]:
        print(f"forked from step {fork['from_step']} as run {fork['id']} ({fork['status']})")
    updated = datetime.fromisoformat(run["updated_at"])
    why = stall(run["status"], run["lease_owner"], updated, queue_liveness(), get_settings())
    if why is not None:
        print(f"note: this run is {why}" if why.startswith("runnable") else f"note: {why}")
    print("\ntimeline:")
    for entry in detail["journal"]:
        when = entry["created_at"][11:19]
        print(f"  {when}  step {entry['step']:>3}  {entry['key']:<28} {entry['summary']}")
    if run["agent_state"]:
        print("\nagent state (as the last checkpoint left it):")
        print(indent(json.dumps(run["agent_state"], indent=2, sort_keys=True), "  "))
    if detail["actions"]:
        print("\nactions:")
        for action in detail["actions"]:
            # The status page's words for the state ("done", not "confirmed"), then the state.
            key, words = action["idempotency_key"], action_words(action)
            print(f"  {key:<40} {words} [{action['state']}]  attempts {action['attempts']}")
    if detail["artifacts"]:
        print("\nartifacts (GET the URL from the API):")
        for artifact in detail["artifacts"]:
            kept = "deleted by retention" if artifact["deleted"] else f"{artifact['size']} bytes"
            print(f"  {artifact['id']:>6}  {artifact['name']:<24} {kept:<22} {artifact['url']}")
    return 0


def cmd_tick(args: argparse.Namespace) -> int:
    report = tick()
    print(
        f"resumed {len(report.resumed)} run(s), woke {len(report.woken)} run(s), "
        f"ended {len(report.expired)} waiting run(s) past their deadline"
    )
    return 0


def register(add: AddCommand) -> None:
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

    runs = add(
        "runs",
        cmd_runs,
        "list runs, newest first; or retry one (`runs retry RUN`), or fork one from a step "
        "(`runs fork RUN --from-step N`), or act on many by filter (`runs bulk KIND --filters`)",
    )
    runs.add_argument("--status")
    runs.add_argument("--agent")
    runs.add_argument("--batch")
    runs.add_argument("--limit", type=int, default=50)
    runs.add_argument("--json", action="store_true")
    verbs = runs.add_subparsers(dest="verb", metavar="VERB")
    retry = verbs.add_parser(
        "retry",
        help="start a failed or cancelled run again from its original request, as a new run "
        "whose key names it (retry-of:RUN); asked again, it answers with that same retry",
    )
    retry.add_argument("run", help="run id, or its first characters (at least 4)")
    retry.add_argument("--json", action="store_true")
    fork = verbs.add_parser(
        "fork",
        help="start a finished run again from one of its steps, as a new run whose key names it "
        "(fork-of:RUN:N): the steps before N are replayed from RUN's journal (nothing they did is "
        "asked or sent again), step N on is live; asked again, it answers with that same fork",
    )
    fork.add_argument("run", help="run id, or its first characters (at least 4)")
    fork.add_argument(
        "--from-step",
        type=int,
        required=True,
        metavar="N",
        help="the first step to run live, numbered as `nightshift show` numbers them (from 0)",
    )
    fork.add_argument("--json", action="store_true")
    register_verb(verbs)

    show = add(
        "show", cmd_show,
        "show a run: status, usage, agent state, journal timeline and actions",
    )  # fmt: skip
    show.add_argument("run", help="run id, or its first characters (at least 4)")
    show.add_argument("--json", action="store_true")

    add(
        "tick",
        cmd_tick,
        "resume orphaned runs, wake due timers and end waiting runs past their deadline once "
        "(beat does this)",
    )
