"""`nightshift check` (issue 33), what a deploy runs first: one line per problem and exit 1,
or one `ok` line and exit 0, run as the real command in a process of its own."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy.engine import make_url

from pipeline.migrate import fresh_database
from pipeline.registry import all_agents
from tests.servers import free_port
from tests.support import nightshift

TEAM_AGENT = "tests.fixture_agents:ACME_TRIAGE"


def _every_need_set() -> dict[str, str | None]:
    """Every setting a registered agent's tools need, set to something."""
    needs = {variable for agent in all_agents() for t in agent.tools for variable in t.needs}
    return {variable: "http://127.0.0.1:9/unused" for variable in needs}


def _schedules(tmp_path: Path, *entries: dict[str, str]) -> str:
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps(list(entries)))
    return str(path)


def test_a_deployment_that_is_ready_checks_ok(db_url: str, tmp_path: Path) -> None:
    # given a migrated database, Redis, every needed setting and a schedule naming an agent
    schedules = _schedules(tmp_path, {"name": "report", "agent": "nightly_report"})
    # when a deploy checks it, then it says ok and exits 0
    done = nightshift("check", NIGHTSHIFT_SCHEDULES_FILE=schedules, **_every_need_set())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok: agents ") and "nightly_report" in done.stdout
    assert "problem" not in done.stdout


def test_each_problem_is_one_line_and_the_check_fails(db_url: str, tmp_path: Path) -> None:
    # given: a schedule naming an agent nobody registered, a team's agent whose own setting and
    # the email URL are unset, an empty database, and no Redis where the broker URL points
    schedules = _schedules(
        tmp_path,
        {"name": "report", "agent": "nightly_report"},
        {"name": "triage", "agent": "acme_trige"},
    )
    empty = str(make_url(db_url).set(database=f"{make_url(db_url).database}_empty"))
    env = _every_need_set() | {
        "NIGHTSHIFT_EMAIL_URL": None,
        "NIGHTSHIFT_CONFIG_ACME_URL": None,
        "NIGHTSHIFT_SCHEDULES_FILE": schedules,
        "NIGHTSHIFT_AGENTS": f"bench.agents:AGENT,bench.agents:SYNTHESIS,{TEAM_AGENT}",
        "NIGHTSHIFT_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    with fresh_database(empty):
        done = nightshift("check", NIGHTSHIFT_DATABASE_URL=empty, **env)
    # then each problem is one line, the check fails, and nothing else is said
    assert done.returncode == 1, done.stdout + done.stderr
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 5, done.stdout
    assert done.stdout.splitlines()[-1] == "5 problem(s): fix them before starting nightshift"
    said = "\n".join(problems)
    assert "schedules: 'triage' names agent 'acme_trige', which is not registered" in said
    # a setting the sandbox provides says so; a team's own says where else it may come from
    email = next(line for line in problems if "NIGHTSHIFT_EMAIL_URL" in line)
    assert "nightly_report (send_report_email)" in email and "nightshift sandbox up" in email
    acme = next(line for line in problems if "NIGHTSHIFT_CONFIG_ACME_URL" in line)
    assert "acme_triage (read_acme_ticket)" in acme and "NIGHTSHIFT_CONFIG_FILE" in acme
    assert "sandbox" not in acme
    assert "schema: the database is at no schema yet, this release needs " in said
    assert "run `nightshift migrate`" in said
    assert "Redis: cannot reach the broker at 127.0.0.1:" in said
    assert done.stderr == ""
