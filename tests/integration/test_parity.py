"""Parity: every registered agent (the shipped ones and the example package's) runs both ways,
on a real worker process and offline through pipeline.testing, against the same services, and
ends the same: the same status, stop reason, answer, journal and actions (keys, arguments,
states, results). Approvals are decided by the same approver both ways, and a timer is waited
out (the worker: beat's tick; offline: `run.advance`).

The services are shared by both sides: each side effect is sent by the worker first and then,
under the same idempotency key, offline (its tool itself stands in for its service: `tools=`
maps each side effect to the tool's own `run`), and each service answers a repeated key with
its first answer, so what the model reads is the same both ways. Their clocks are stopped, so
the times they write (`as_of`, `sent_at`) are the same too."""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from models import Action, JournalEntry, RunStatus
from pipeline.agents.patch import REVIEWER
from pipeline.agents.price_synthesis import PRICING_APPROVER
from pipeline.db import transaction
from pipeline.registry import agent_names, get_agent
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.start import start_run
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.git_repos import DEMO_REPO
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.transport import Request, Response
from pipeline.sandbox.web import SKU_BASE_PRICES, WebSandbox, competitors
from pipeline.settings import get_settings
from pipeline.testing import run_agent
from pipeline.testing.agent_run import start_synthesis
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for, wait_for_status

STOPPED_CLOCK = 1_796_000_000.0  # 2026-11-29, a night
TIMER_SECONDS = 2
ENDED = {s.value for s in RunStatus if s.is_terminal()} | {RunStatus.WAITING.value}


def _children() -> list[dict[str, Any]]:
    """Four competitor runs' outcomes, as a batch hands them to its synthesis: each quotes
    about 10% above our price book, so every SKU's change is proposed (and approved)."""
    found = []
    for i, listed in enumerate(competitors(4)):
        prices = {sku: round(base * (1.08 + i / 100), 2) for sku, base in SKU_BASE_PRICES.items()}
        report = {"competitor": listed["id"], "name": listed["name"], "ok": True,
                  "currency": "USD", "prices": prices}  # fmt: skip
        found.append({"item": {"competitor": listed["id"], "name": listed["name"]},
                      "status": "succeeded", "result": json.dumps(report)})  # fmt: skip
    return found


@dataclass(frozen=True)
class Scenario:
    input: dict[str, Any]
    approver: str | None = None
    timer: bool = False
    batch: str | None = None
    """Run as this batch's synthesis, as a night's fan-out starts it."""


SCENARIOS = {
    "nightly_report": Scenario({"team": "ops", "date": "2026-11-29"}),
    "follow_up": Scenario({"after_seconds": TIMER_SECONDS}, timer=True),
    "patch": Scenario(
        {"issue": 42, "repo": DEMO_REPO, "title": "totals are not rounded"}, approver=REVIEWER
    ),
    "competitor_monitor": Scenario({"competitor": "c01", "name": "Competitor 1"}),
    "price_synthesis": Scenario(
        {"batch": "parity-night", "children": _children()},
        approver=PRICING_APPROVER,
        batch="parity-night",
    ),
    "invoice_reminders": Scenario({"date": "2026-11-30"}),
    "bench": Scenario({"steps": 3}),
    "bench_synthesis": Scenario(
        {"batch": "parity-night", "children": [{"status": "succeeded", "item": {"steps": 3}}]}
    ),
    "oncall_digest": Scenario({"team": "ops", "date": "2026-11-29"}),
}


# -- services that answer a repeated key with the first answer, on a stopped clock -------------


class StoppedClock:
    def now(self) -> float:
        return STOPPED_CLOCK


class Web(StoppedClock, WebSandbox):
    pass


class Email(StoppedClock, EmailSandbox):
    pass


class Pricing(StoppedClock, PricingSandbox):
    """The price book, which a side's approved changes move: the offline side finds it as the
    worker's side did (its keys kept, so a repeated change is answered as the first was)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._at_start = copy.deepcopy(self._prices)

    def as_at_the_start(self) -> None:
        with self._lock:
            self._prices = copy.deepcopy(self._at_start)


class GitHost(StoppedClock, GitHostSandbox):
    """The git host behind a proxy that answers a repeated Idempotency-Key with the first
    answer (as the mail and pricing services do themselves)."""

    def __init__(self, **options: Any) -> None:
        self._answered: dict[str, Response] = {}
        super().__init__(**options)

    def _create(self, request: Request) -> Response:
        key = request.header("Idempotency-Key")
        if key is not None and key in self._answered:
            return self._answered[key]
        answer = super()._create(request)
        if key is not None:
            self._answered[key] = answer
        return answer


@dataclass
class Services:
    env: dict[str, str]
    """The settings naming them, as a worker has them and as the offline run is given them."""
    pricing: Pricing


@pytest.fixture
def shared_services(
    db_url: str, git_remotes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Services]:
    web = Web(log_path=tmp_path / "web.jsonl").start()
    email = Email(log_path=tmp_path / "email.jsonl").start()
    pricing = Pricing(log_path=tmp_path / "pricing.jsonl").start()
    githost = GitHost(log_path=tmp_path / "githost.jsonl", git_root=git_remotes).start()
    env = {
        "NIGHTSHIFT_WEB_URL": web.url,
        "NIGHTSHIFT_EMAIL_URL": email.url,
        "NIGHTSHIFT_PRICING_URL": pricing.url,
        "NIGHTSHIFT_GITHOST_URL": githost.url,
        "NIGHTSHIFT_CONFIG_PATCH_GIT_URL": os.environ["NIGHTSHIFT_CONFIG_PATCH_GIT_URL"],
        "NIGHTSHIFT_CONFIG_ONCALL_WEB_URL": web.url,
        "NIGHTSHIFT_CONFIG_ONCALL_EMAIL_URL": email.url,
        "NIGHTSHIFT_CONFIG_ONCALL_EMAIL_TOKEN": "tok-parity",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the scripted model both ways
    get_settings.cache_clear()
    yield Services(env, pricing)
    for service in (githost, pricing, email, web):
        service.stop()


# -- what each side ended with, in the same words -----------------------------------------------


@dataclass(frozen=True)
class Ending:
    status: str
    reason: str | None
    answer: str
    journal: list[tuple[str, str]]
    actions: list[tuple[str, str, str, Any, str, Any]]


def on_a_worker(name: str, scenario: Scenario) -> Ending:
    if scenario.batch is None:
        run_id = start_run(name, scenario.input).run_id
    else:
        run_id = start_synthesis(name, scenario.input, scenario.batch)
    wait_for_status(run_id, ENDED, timeout=120)
    decided: set[str] = set()
    while scenario.approver is not None and _pending(run_id):
        for key in _pending(run_id):
            decide(key, Decision.APPROVE, Actor(scenario.approver, "parity test"))
            decided.add(key)
        wait_for(lambda: _moved_on(run_id, decided), timeout=120, what=f"run {run_id} to go on")
    if scenario.timer:  # beat's tick wakes it once the timer is due
        wait_for_status(run_id, ENDED - {RunStatus.WAITING.value}, timeout=60)
    with transaction() as session:
        journal = session.execute(
            select(JournalEntry.key, JournalEntry.step_name)
            .where(JournalEntry.run_id == run_id).order_by(JournalEntry.id)
        ).all()  # fmt: skip
        actions = session.scalars(
            select(Action).where(Action.run_id == run_id).order_by(Action.created_at)
        ).all()
        recorded = [(a.idempotency_key, a.tool, a.service, a.args, a.state.value, a.result)
                    for a in actions]  # fmt: skip
    row = run_row(run_id)
    answer = str((row.result or {}).get("text", ""))
    return Ending(row.status.value, row.stop_reason, answer, [tuple(j) for j in journal], recorded)


def _moved_on(run_id: uuid.UUID, decided: set[str]) -> bool:
    """Ended or waiting again, and no longer for an approval already given."""
    row = run_row(run_id)
    still = row.waiting_on is not None and row.waiting_on.partition(":")[2] in decided
    return row.status in ENDED and not still


def _pending(run_id: uuid.UUID) -> list[str]:
    with transaction() as session:
        return list(
            session.scalars(
                select(Action.idempotency_key).where(
                    Action.run_id == run_id, Action.state == "pending_approval"
                )
            )
        )


def offline(name: str, scenario: Scenario, env: dict[str, str], data_dir: Path) -> Ending:
    agent = get_agent(name)
    sends = {t.name: t.run for t in agent.tools if t.has_side_effects}
    run = run_agent(agent, scenario.input, tools=sends, batch=scenario.batch,
                    env={**env, "NIGHTSHIFT_DATA_DIR": str(data_dir)})  # fmt: skip
    while scenario.approver is not None and run.pending:
        run.approve(run.pending[0].key, by=scenario.approver)
    if scenario.timer:
        run.advance(seconds=TIMER_SECONDS + 1)
    journal = [(e.key, e.step_name) for e in run.journal]
    actions = [(a.key, a.tool, a.service, a.args, a.state.value, a.result) for a in run.actions]
    return Ending(run.status.value, run.reason, run.answer, journal, actions)


# -- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _example(example_installed: None) -> None:
    """The example package is installed, so its agent is registered like the shipped ones."""


def test_every_registered_agent_has_a_parity_scenario() -> None:
    assert set(agent_names()) <= set(SCENARIOS), "add a Scenario for each new agent"
    assert "oncall_digest" in agent_names()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_an_agent_ends_the_same_on_a_worker_and_offline(
    name: str, shared_services: Services, processes: ProcessFactory, tmp_path: Path
) -> None:
    if name not in agent_names():
        pytest.skip(f"{name} is not registered")
    scenario = SCENARIOS[name]
    if scenario.timer:
        processes("beat", beat=True)
    processes("worker")

    worked = on_a_worker(name, scenario)
    shared_services.pricing.as_at_the_start()
    tested = offline(name, scenario, shared_services.env, tmp_path / "offline-data")

    assert worked.status == "succeeded", worked
    assert tested == worked
