"""Deploying while runs wait: a new release meets runs its old one started. A tool call that
already has an action is settled through that action, whatever key the new release computes."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import select

from models import Action, ActionAudit, ActionState, RunStatus
from pipeline import BatchPlan
from pipeline.db import transaction
from pipeline.registry import registry
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.fanout import create_batch_txn
from pipeline.runs.start import start_run
from pipeline.runs.versions import allow_version
from pipeline.settings import get_settings
from pipeline.views import feed
from pipeline.views.feed import Subject
from pipeline.views.metrics import collect
from pipeline.views.runs import show_run
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, tool_results_of, wait_for, wait_for_status

OLD, NEW = "tests.fixture_agents:NOTIFIER", "tests.fixture_agents:NOTIFIER_REKEYED"
NEXT = "tests.fixture_agents:NOTIFIER_NEXT"
INCIDENT = {"team": "ops", "id": "INC-7"}
OLD_KEY = "notifier:INC-7"
SETTLED = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.NEEDS_ATTENTION.value}


@pytest.fixture
def scripted(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """The sandbox's services, with each worker's own registered script as the model: the
    two releases run side by side, each with its own agent definition."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    return sandbox


def actions_of(run_id: uuid.UUID) -> list[Action]:
    with transaction() as session:
        return list(session.scalars(select(Action).where(Action.run_id == run_id)))


def crash_old_release_at(
    point: str, processes: ProcessFactory, register: Callable[..., None]
) -> uuid.UUID:
    """A run of the old release, whose worker dies at the crash point `point`."""
    register(OLD)
    processes("beat", beat=True)  # its tick hands the dead worker's run on
    doomed = processes("old", env={"NIGHTSHIFT_AGENTS": OLD, "NIGHTSHIFT_CRASH_POINTS": point})
    run_id = start_run("notifier", INCIDENT).run_id
    wait_for(doomed.exited, timeout=60, what=f"the old release's worker to die at {point}")
    return run_id


def crash_after_send_then_resume_rekeyed(
    scripted: Sandbox, processes: ProcessFactory, register: Callable[..., None], mode: str
) -> uuid.UUID:
    """The old release sends and dies before the reply is saved; the new one resumes."""
    scripted.email.mode = mode  # type: ignore[assignment]
    run_id = crash_old_release_at("after_send_before_reply", processes, register)
    assert len(scripted.email.deliveries()) == 1
    processes("new", env={"NIGHTSHIFT_AGENTS": NEW})
    return run_id


def test_a_changed_key_function_waits_for_a_person_when_the_service_cannot_tell(
    scripted: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    duplicate_report: list[int],
) -> None:
    # given an email API that neither dedups keys nor answers lookups
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "none")

    # when the new release, keying the call `ops-INC-7`, resumes the old release's run
    run_id = crash_after_send_then_resume_rekeyed(scripted, processes, register_agents, "no-keys")
    row = wait_for_status(run_id, SETTLED, timeout=60)

    # then it waits for a person on the action it recorded, under its own key
    assert row.status == RunStatus.NEEDS_ATTENTION, row.error
    assert row.waiting_on == f"action:{OLD_KEY}"
    [action] = actions_of(run_id)
    assert (action.idempotency_key, action.state) == (OLD_KEY, ActionState.OUTCOME_UNKNOWN)
    assert len(scripted.email.deliveries()) == 1

    # and once a person says it happened, the run finishes without sending again
    decide(OLD_KEY, Decision.HAPPENED, Actor("oncall@example.com", "test"), note="in the inbox")
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)
    duplicate_report.append(len(scripted.email.deliveries()) - 1)
    assert len(scripted.email.deliveries()) == 1
    assert [a.idempotency_key for a in actions_of(run_id)] == [OLD_KEY]
    assert collect().possible_duplicates == 0


@pytest.mark.parametrize(("mode", "setting"), [("no-keys-lookup", "lookup"), ("keys", "keys")])
def test_a_changed_key_function_is_settled_by_a_lookup_under_the_recorded_key(
    mode: str,
    setting: str,
    scripted: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    duplicate_report: list[int],
) -> None:
    # given an email API that can say what was delivered under a key (and, in `keys`, dedups)
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", setting)

    # when the new release resumes the old release's run after its send
    run_id = crash_after_send_then_resume_rekeyed(scripted, processes, register_agents, mode)
    row = wait_for_status(run_id, SETTLED, timeout=60)

    # then the lookup under the old key settles it: one email, one action, no duplicate
    assert row.status == RunStatus.SUCCEEDED, row.error
    [action] = actions_of(run_id)
    assert (action.idempotency_key, action.state) == (OLD_KEY, ActionState.CONFIRMED)
    # never resent blind, even to a service that dedups: the new release keys it otherwise
    assert (action.resolution, action.attempts) == ("lookup", 1)
    duplicate_report.append(len(scripted.email.deliveries()) - 1)
    assert len(scripted.email.deliveries()) == 1
    assert collect().possible_duplicates == 0


# -- a renamed tool and a changed prompt across a crash, under each policy -------------------

RELEASES = {
    "continue": "tests.fixture_agents:NOTIFIER_RENAMED",
    "park": "tests.fixture_agents:NOTIFIER_RENAMED_PARKS",
    "fail": "tests.fixture_agents:NOTIFIER_RENAMED_FAILS",
}


@pytest.mark.parametrize(
    ("policy", "reason"), [("continue", "tool_missing"), ("park", "version_changed")]
)
def test_a_renamed_tool_and_a_new_prompt_wait_for_a_person_who_allows_them(
    policy: str,
    reason: str,
    scripted: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
) -> None:
    # given a run whose first reply, journaled by the old release, calls notify_team
    run_id = crash_old_release_at("after_model_journaled", processes, register_agents)
    started = run_row(run_id).agent_version

    # when the release that renamed it notify_channel (and changed the prompt) resumes it
    processes("new", env={"NIGHTSHIFT_AGENTS": RELEASES[policy]})
    row = wait_for_status(run_id, SETTLED, timeout=60)

    # then the run waits for a person, saying what changed; nothing went to the model or out
    assert (row.status, row.stop_reason) == (RunStatus.NEEDS_ATTENTION, reason), row.error
    wait, _, version = row.waiting_on.partition(":")
    assert wait == "version" and version != started
    assert ("notify_team" if policy == "continue" else started) in row.error
    assert tool_results_of(run_id) == [] and scripted.email.deliveries() == []

    # when a person allows the new version
    allow_version(run_id, Actor("lead@example.com", "test"), note="the rename is intended")
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)

    # then the old call is answered as removed (never "unknown tool"), the new tool sends once
    results = tool_results_of(run_id)
    assert "removed by a new release" in results[0]
    assert not any("unknown tool" in r for r in results)
    assert len(scripted.email.deliveries()) == 1
    assert (row.agent_version, row.running_version) == (started, version)
    assert show_run(run_id)["run"]["version"] == (
        f"started under {started}, now running under {version}"
    )
    # and the run's feed records the change, once, from the old version to the new one
    changes = [e.data for e in feed.read(Subject(run_id=run_id)).events
               if e.type == "version_changed"]  # fmt: skip
    assert changes == [{"from": started, "to": version}]
    with transaction() as session:
        audit = session.scalars(select(ActionAudit).where(ActionAudit.run_id == run_id)).all()
    assert [(a.event, a.by, a.action_key) for a in audit] == [
        ("allow_version", "lead@example.com", f"version:{version}")
    ]
    assert collect().version_changed_runs == {"notifier": 1}


def test_a_renamed_tool_and_a_new_prompt_fail_the_run_under_fail(
    scripted: Sandbox, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    run_id = crash_old_release_at("after_model_journaled", processes, register_agents)
    processes("new", env={"NIGHTSHIFT_AGENTS": RELEASES["fail"]})
    row = wait_for_status(run_id, SETTLED | {RunStatus.CANCELLED.value}, timeout=60)
    assert (row.status, row.stop_reason) == (RunStatus.FAILED, "version_changed"), row.error
    assert f"started under {row.agent_version}" in row.error
    assert tool_results_of(run_id) == [] and scripted.email.deliveries() == []


# -- non-determinism that fires -----------------------------------------------------------


def test_arguments_the_new_schema_refuses_are_reported_and_settled_through_their_action(
    scripted: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a send whose reply was lost, and a release whose schema now requires a severity
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "lookup")
    scripted.email.mode = "no-keys-lookup"
    run_id = crash_old_release_at("after_send_before_reply", processes, register_agents)

    # when that release resumes the run
    new = processes("new", env={"NIGHTSHIFT_AGENTS": "tests.fixture_agents:NOTIFIER_STRICTER"})
    row = wait_for_status(run_id, SETTLED, timeout=60)

    # then the refusal is reported with what changed, and the recorded action settles the call
    assert row.status == RunStatus.SUCCEEDED, row.error
    log = new.log_path.read_text()
    assert "non-determinism (arguments_refused)" in log and "'severity' is a required" in log
    [action] = actions_of(run_id)
    assert (action.state, action.resolution) == (ActionState.CONFIRMED, "lookup")
    assert not any("invalid arguments" in r for r in tool_results_of(run_id))
    assert len(scripted.email.deliveries()) == 1


def test_a_replayed_result_of_a_side_effect_that_changed_service_is_reported(
    scripted: Sandbox, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given a reply whose notification was sent and journaled before the worker died
    run_id = crash_old_release_at("after_tool_journaled", processes, register_agents)

    # when a release that declares notify_team as another service replays it
    new = processes("new", env={"NIGHTSHIFT_AGENTS": "tests.fixture_agents:NOTIFIER_TO_CHAT"})
    row = wait_for_status(run_id, SETTLED, timeout=60)

    # then the change is reported, the recorded result stands and nothing is sent again
    assert row.status == RunStatus.SUCCEEDED, row.error
    log = new.log_path.read_text()
    assert "non-determinism (service_changed)" in log and "'email'" in log and "'chat'" in log
    assert len(scripted.email.deliveries()) == 1


# -- two releases side by side through one batch -------------------------------------------


def test_two_releases_through_one_batch_send_each_notification_once(
    scripted: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a batch of notifications, and workers of both releases on one queue; the old one
    # dies after its first send
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "lookup")
    scripted.email.mode = "no-keys-lookup"
    register_agents(OLD, "tests.fixture_agents:NOTIFY_SUMMARY")
    both = f"{OLD},tests.fixture_agents:NOTIFY_SUMMARY"
    processes("beat", beat=True)
    doomed = processes(
        "old", env={"NIGHTSHIFT_AGENTS": both, "NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"}
    )
    processes("new", env={"NIGHTSHIFT_AGENTS": f"{NEXT},tests.fixture_agents:NOTIFY_SUMMARY"})
    incidents = [{"team": "ops", "id": f"INC-{n}"} for n in range(8)]
    plan = BatchPlan("deploy-batch", "deploy", "notifier", incidents, "notify_summary", {})
    registry()  # loaded as a process loads its agents at start, not inside the transaction
    with transaction() as session:
        children = create_batch_txn(session, plan)

    # when the batch finishes
    wait_for(doomed.exited, timeout=90, what="the old release's worker to die after a send")
    rows = [wait_for_status(c, {RunStatus.SUCCEEDED.value}, timeout=90) for c in children]

    # then every incident was notified once, and the runs show both versions
    sent = [d["subject"] for d in scripted.email.deliveries()]
    assert sorted(sent) == sorted(f"Incident {i['id']}" for i in incidents)
    assert all(len(actions_of(c)) == 1 for c in children)
    old_version = rows[0].agent_version
    assert {r.agent_version for r in rows} == {old_version}
    moved = [r for r in rows if r.running_version != old_version]
    assert moved, "no run was resumed or run by the new release"
    assert show_run(moved[0].id)["run"]["version"] == (
        f"started under {old_version}, now running under {moved[0].running_version}"
    )
    assert collect().possible_duplicates == 0
