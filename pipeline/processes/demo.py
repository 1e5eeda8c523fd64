"""`nightshift demo`: the nightly report on real workers, with two crashes, watched live; then
Patch fixing a real bug in a repository, pushing only once a person approves.

1. A worker is SIGKILLed in the middle of the run; another worker resumes from the checkpoint.
2. The next worker dies right after the report email went out, before the reply was saved;
   the one after it reconciles (same idempotency key) instead of sending a second email.
3. Patch reads the demo repository (a bare repository standing in for the remote: line totals
   not rounded to cents, a failing test), tests its change in the issue's worktree and waits
   for a reviewer with nothing pushed; approved, it pushes one commit and opens one pull request.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

import pipeline.embedded as embedded
from models import Action, Run
from pipeline.db import broker_url, database_url, transaction
from pipeline.errors import Conflict
from pipeline.migrate import upgrade
from pipeline.processes.celery_process import CeleryProcess, wait_for
from pipeline.registry import SHIPPED_ENV, registry
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.start import start_run
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.git_repos import DEMO_REPO, has_branch, seed_demo_repository, url_template
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.responders import agent_responder
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import use_environment
from pipeline.views.artifacts import read_artifact
from pipeline.views.runs import show_run

DEMO_AGENTS = ("nightly_report", "patch")
LEASE_SECONDS = 5  # shorter than the 15 s default so the demo does not keep you waiting


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_snapshot(run_id: uuid.UUID) -> Run:
    with transaction() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return run


def holder_pid(run: Run) -> int | None:
    return int(run.lease_owner.split(":")[1]) if run.lease_owner else None


class Demo:
    def __init__(self, workdir: Path, queue: str) -> None:
        self.workdir = workdir
        self.web = WebSandbox(log_path=workdir / "web.jsonl").start()
        self.email = EmailSandbox(log_path=workdir / "email.jsonl").start()
        self.remotes = workdir / "remotes"
        seed_demo_repository(self.remotes)
        self.githost = GitHostSandbox(
            log_path=workdir / "githost.jsonl", git_root=self.remotes
        ).start()
        # The real anthropic SDK talks to a local Messages API server with scripted replies.
        self.model = MessagesSandbox(
            responder=agent_responder, latency_seconds=0.8, log_path=workdir / "messages.jsonl"
        ).start()
        self.processes: list[CeleryProcess] = []
        self.env = {
            "NIGHTSHIFT_DATABASE_URL": database_url(),
            "NIGHTSHIFT_BROKER_URL": broker_url(),
            "NIGHTSHIFT_QUEUE": queue,
            "NIGHTSHIFT_WEB_URL": self.web.url,
            "NIGHTSHIFT_EMAIL_URL": self.email.url,
            "NIGHTSHIFT_EMAIL_MODE": "keys",
            "NIGHTSHIFT_GITHOST_URL": self.githost.url,
            "NIGHTSHIFT_CONFIG_PATCH_GIT_URL": url_template(self.remotes),
            "ANTHROPIC_API_KEY": "local-demo-key",
            "ANTHROPIC_BASE_URL": self.model.url,
            "NIGHTSHIFT_LEASE_SECONDS": str(LEASE_SECONDS),
            "NIGHTSHIFT_HEARTBEAT_SECONDS": "1",
            "NIGHTSHIFT_TICK_SECONDS": "1",
        }

    def start(self, name: str, beat: bool = False, **env: str) -> CeleryProcess:
        process = CeleryProcess(
            name=name, log_path=self.workdir / f"{name}.log", env={**self.env, **env}, beat=beat
        )
        self.processes.append(process)
        return process.start()

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
        for server in (self.model, self.githost, self.email, self.web):
            server.stop()


# The demo's own error (only `nightshift demo` raises it), so it stays at this edge.
class DemoRunning(Conflict):
    """Another demo holds the data directory's demo lock."""


def run_demo() -> int:
    """The demo, one at a time per data directory. However it ends (done, a timeout, an error,
    Ctrl-C), it first stops the workers, beat, sandbox services and embedded servers it started;
    the error, or KeyboardInterrupt, then goes on to the caller."""
    # Its own queue: workers already serving the default queue know nothing of the sandbox.
    queue = {"NIGHTSHIFT_QUEUE": f"nightshift-demo-{os.getpid()}"}
    use_environment(queue, only_unset=True)
    # The shipped agents it runs, besides any named already (they are off until named), in
    # this process and the workers it starts.
    named = os.environ.get(SHIPPED_ENV, "")
    settings = use_environment({SHIPPED_ENV: ",".join(filter(None, (named, *DEMO_AGENTS)))})
    registry.cache_clear()
    root = _demo_root(settings.data_dir)
    try:
        with _only_demo(root):
            return _run_locked(settings.data_dir, settings.embedded, settings.queue, root)
    except DemoRunning as running:
        print(f"nightshift demo: {running}", file=sys.stderr, flush=True)
        return 1


def _run_locked(data_dir: Path, embedded_default: bool, queue: str, root: Path) -> int:
    found_running = _running_services(data_dir) if embedded_default else None
    demo = None
    try:
        if embedded_default:
            say(f"starting the embedded PostgreSQL and Redis in {data_dir} (no URLs configured)")
            embedded.ensure_running(data_dir)
        upgrade()
        demo = Demo(Path(tempfile.mkdtemp(prefix="demo-", dir=root)), queue)
        return _story(demo)
    except TimeoutError as exc:
        # One line, not a traceback: the logs say why, and they are kept.
        say(f"the demo did not finish: {exc}; worker logs in {demo.workdir if demo else root}")
        return 1
    finally:
        with _ctrl_c_waits():
            if demo is not None:
                demo.stop()
            if found_running is not None:
                _stop_services_started_since(found_running, data_dir)


def _demo_root(data_dir: Path) -> Path:
    root = data_dir / "demo"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def _only_demo(root: Path) -> Iterator[None]:
    """One demo at a time per data directory: a second one would stop the embedded services
    under the first. The lock goes with the process, however it ends."""
    with open(root / "demo.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise DemoRunning(f"a demo is already running (pid {holder})") from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        yield


def _running_services(data_dir: Path) -> set[str]:
    return {info.name for info in embedded.status(data_dir) if info.running}


def _stop_services_started_since(found_running: set[str], data_dir: Path) -> None:
    """Stop the embedded servers this demo started (one of them, if starting the other
    failed); the ones that ran before it keep running."""
    started = _running_services(data_dir) - found_running
    if started:
        say(f"stopping the embedded {' and '.join(sorted(started))} this demo started")
        embedded.stop(data_dir, only=started)


@contextmanager
def _ctrl_c_waits() -> Iterator[None]:
    """A second Ctrl-C while the demo stops what it started would leave workers or servers
    running: it waits until they are stopped (each stop is bounded)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _story(demo: Demo) -> int:
    say("starting beat (the tick) and worker w1")
    demo.start("beat", beat=True)
    w1 = demo.start("w1")
    today = date.today().isoformat()
    # A team of this demo's own: the report's key is its date and team, and an earlier demo's
    # email under the same key would (rightly) be reused instead of staging the crash again.
    team = f"ops-{secrets.token_hex(3)}"
    run_id = start_run("nightly_report", {"team": team, "date": today}).run_id
    say(f"started nightly_report run {run_id} for team {team}, {today}")

    run = wait_for(lambda: _at_step(run_id, 2), 60, "the run to reach step 2")
    say(f"step {run.step} in flight on w1 (pid {w1.pid}); sending SIGKILL to w1")
    w1.kill()
    killed_at = time.monotonic()
    w2 = demo.start("w2", NIGHTSHIFT_CRASH_POINTS="after_send_before_reply")
    say("started w2; it will die right after the report email goes out (crash point)")
    resumed = wait_for(lambda: _held_by(run_id, w2.pid), 60, "w2 to resume the run")
    resume_seconds = time.monotonic() - killed_at
    say(f"w2 resumed the run at step {resumed.step}, {resume_seconds:.1f}s after the kill")

    wait_for(lambda: w2.exited() or None, 90, "w2 to reach the email")
    delivered = len(_emails_of(demo, run_id))
    say(f"w2 died after the send; emails delivered so far: {delivered}; reply not saved")
    w3 = demo.start("w3")
    say("started w3; it finds the email attempted with no reply and reconciles")
    finished = wait_for(lambda: _finished(run_id), 90, "the run to finish")
    say(f"run {finished.status} on w3 (pid {w3.pid}) after {finished.attempt} claims")
    _summary(demo, run_id, resume_seconds)
    reported = finished.status == "succeeded" and len(_emails_of(demo, run_id)) == 1
    return 0 if reported and _patch_story(demo) else 1


def _patch_story(demo: Demo) -> bool:
    # An issue number of this demo's own, for the same reason as the team above: the pull
    # request's key is the repository and the issue's branch.
    issue = 1000 + secrets.randbelow(999_000)
    branch = f"patch/issue-{issue}"
    bug = {"issue": issue, "repo": DEMO_REPO, "title": "line totals are not rounded to cents"}
    run_id = start_run("patch", bug).run_id
    say(f"started patch run {run_id} for issue {issue} of {DEMO_REPO} (a bare repository here)")
    wait_for(lambda: run_snapshot(run_id).status == "waiting" or None, 90, "the approval")
    with transaction() as session:
        action = session.scalar(select(Action).where(Action.run_id == run_id))
    assert action is not None
    pushed_before = has_branch(demo.remotes, DEMO_REPO, branch)
    say(f"Patch waits for {action.approvers or 'anyone'}; pushed so far: {pushed_before}")
    print("\nThe change it tested and asks to push:\n")
    print(action.args["patch"])
    reviewer = action.approvers[0] if action.approvers else "reviewer@example.com"
    decide(action.idempotency_key, Decision.APPROVE, Actor(reviewer, "nightshift demo"))
    say(f"{reviewer} approved; Patch commits, pushes {branch} and opens the pull request")
    finished = wait_for(lambda: _finished(run_id), 90, "the patch run to finish")
    opened = [e for e in demo.githost.log.entries() if e["action"] == "opened"]
    pushed = has_branch(demo.remotes, DEMO_REPO, branch)
    say(f"patch run {finished.status}; {branch} pushed: {pushed}; pulls opened: {len(opened)}")
    return finished.status == "succeeded" and pushed and not pushed_before and len(opened) == 1


def _emails_of(demo: Demo, run_id: uuid.UUID) -> list[dict[str, Any]]:
    """The emails sent under this run's action key: a run left by an earlier, interrupted demo
    may be resumed by this demo's tick and send its own."""
    with transaction() as session:
        key = session.scalar(select(Action.idempotency_key).where(Action.run_id == run_id))
    return demo.email.deliveries(key) if key else []


def _at_step(run_id: uuid.UUID, step: int) -> Run | None:
    run = run_snapshot(run_id)
    return run if run.step >= step and run.lease_owner else None


def _held_by(run_id: uuid.UUID, pid: int) -> Run | None:
    run = run_snapshot(run_id)
    return run if holder_pid(run) == pid else None


def _finished(run_id: uuid.UUID) -> Run | None:
    run = run_snapshot(run_id)
    return run if run.status in ("succeeded", "failed", "needs_attention") else None


def _summary(demo: Demo, run_id: uuid.UUID, resume_seconds: float) -> None:
    detail = show_run(run_id)
    print("\nWhat happened, from the journal (+s: time since the previous entry):")
    previous = datetime.fromisoformat(detail["run"]["created_at"])
    for entry in detail["journal"]:
        at = datetime.fromisoformat(entry["created_at"])
        gap = (at - previous).total_seconds()
        previous = at
        print(f"  {at:%H:%M:%S}  +{gap:5.1f}s  step {entry['step']}  {entry['summary']}")
    with transaction() as session:
        action = session.scalar(select(Action).where(Action.run_id == run_id))
    fetches = demo.web.requests()
    model_calls = len(list((demo.workdir / "messages.jsonl").read_text().splitlines()))
    print("\nThe numbers:")
    once = all(count == 1 for count in fetches.values())
    print(
        f"  source fetches: {fetches}" + (" - each once; replays used the journal" if once else "")
    )
    print(
        f"  model calls: {model_calls} for {detail['run']['step']} steps "
        "(only a call in flight at a crash is asked again)"
    )
    print(f"  emails delivered: {len(_emails_of(demo, run_id))}")
    if action is not None:
        print(
            f"  email action {action.idempotency_key}: {action.state}, "
            f"{action.attempts} attempts, resolved by {action.resolution or 'first send'}"
        )
    print(f"  kill -> resume on another worker: {resume_seconds:.1f}s (lease {LEASE_SECONDS}s)")
    _totals(detail)
    report = detail["run"]["state"].get("artifacts", {}).get("report")
    if report:
        print(f"\nThe report (artifact {report['id']}, GET {report['url']}):\n")
        print(read_artifact(run_id, report["id"]).text or "")
    print(f"worker logs: {demo.workdir}")


def _totals(detail: dict[str, Any]) -> None:
    run = detail["run"]
    created = datetime.fromisoformat(run["created_at"])
    finished = datetime.fromisoformat(run["finished_at"] or run["updated_at"])
    print(
        f"  wall time {(finished - created).total_seconds():.1f}s; "
        f"tokens in/out {run['input_tokens']}/{run['output_tokens']} (cache write/read "
        f"{run['cache_creation_input_tokens']}/{run['cache_read_input_tokens']}); "
        f"cost ${run['cost_usd']:.4f}"
    )
