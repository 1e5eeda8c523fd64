"""Artifacts live in PostgreSQL: a report a real worker wrote is served by the API whatever
data dir either has; one over NIGHTSHIFT_ARTIFACT_MAX_BYTES is refused to the model with
nothing kept; a worker killed around the write leaves one report and no orphan; migration
0026 moves the files of the release before into the table."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import func, select, text

from models import Artifact, RunStatus
from pipeline.cli.main import main
from pipeline.db import dispose_all, transaction
from pipeline.engine.step import StepOutcome, execute_step
from pipeline.migrate import alembic_config, upgrade
from pipeline.runs.redaction import delete_artifacts_txn
from pipeline.runs.start import create_run_txn, start_run
from pipeline.settings import get_settings
from pipeline.views.artifacts import read_artifact
from pipeline.views.runs import show_run
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, tool_results, wait_for, wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
WRITER = "tests.fixture_agents:REPORT_WRITER"


def artifact_rows(run_id: uuid.UUID) -> list[tuple[str, int | None]]:
    with transaction() as session:
        rows = session.execute(
            select(Artifact.name, func.octet_length(Artifact.content)).where(
                Artifact.run_id == run_id
            )
        ).all()
    return [(name, size) for name, size in rows]


def test_a_report_a_worker_wrote_is_served_by_the_api(
    sandbox: Sandbox,
    processes: ProcessFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given a worker whose data dir is not the API's
    worker_data = tmp_path / "worker-data"
    processes("w1", env={"NIGHTSHIFT_DATA_DIR": str(worker_data)})

    # when it runs a nightly report
    run_id = start_run("nightly_report", REPORT).run_id
    row = wait_for_status(run_id, DONE, timeout=90)
    assert row.status == RunStatus.SUCCEEDED, row.error

    # then the run's result names the report by id and API URL, never a path on the worker
    report = row.result["state"]["artifacts"]["report"]
    assert report["url"] == f"/runs/{run_id}/artifacts/{report['id']}"
    assert "path" not in report and str(worker_data) not in str(row.result)
    assert not (worker_data / "artifacts").exists(), "nothing is kept on the worker's disk"

    # and the API, with a data dir of its own, serves it from PostgreSQL as written
    api = client(AUTH)
    served = api.get(report["url"])
    assert served.status_code == 200, served.text
    assert served.headers["content-type"] == "text/markdown; charset=utf-8"
    assert served.headers["x-content-type-options"] == "nosniff"
    assert sha256(served.content) == report["sha256"]
    assert served.text.startswith("# ") and len(served.content) == report["size"]
    listed = api.get(f"/runs/{run_id}").json()["artifacts"]
    assert {a["name"]: a["url"] for a in listed}["report"] == report["url"]

    # and `nightshift show` lists it with its URL
    assert main(["show", str(run_id)]) == 0
    assert report["url"] in capsys.readouterr().out

    # and without a token, or for another run's id, it is not served
    assert client().get(report["url"]).status_code == 401
    assert api.get(f"/runs/{run_id}/artifacts/{report['id'] + 1000}").status_code == 404

    # and once retention deleted its content, the API says so (410), the row stays
    with transaction() as session:
        delete_artifacts_txn(session, run_id)
    gone = api.get(report["url"])
    assert gone.status_code == 410 and "deleted by retention" in gone.json()["error"]
    assert ("report", None) in artifact_rows(run_id)


@pytest.mark.parametrize("point", ["before_artifact_committed", "after_tool_journaled"])
def test_a_worker_killed_around_the_write_leaves_one_report_and_no_orphan(
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    point: str,
) -> None:
    # given an agent whose only tool call writes the report, and a worker that dies right
    # before that transaction commits, or right after
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the agent's own script answers
    register_agents(WRITER)
    processes("beat", beat=True)  # its tick hands the dead worker's run on
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": point})
    run_id = start_run("report_writer", {"team": "ops"}).run_id
    wait_for(doomed.exited, timeout=60, what=f"the worker to die at {point}")

    # when another worker takes the run over
    processes("w2")
    row = wait_for_status(run_id, DONE, timeout=90)
    assert row.status == RunStatus.SUCCEEDED, row.error

    # then there is one report, the one the journal and the run's state name, and no other
    # row (a rolled-back write left nothing; a committed one was replayed, not written again)
    with transaction() as session:
        kept = session.execute(
            select(Artifact.id, Artifact.content).where(Artifact.run_id == run_id)
        ).all()
    [(artifact_id, content)] = kept
    assert content == b"# Report for ops\n\nAll quiet tonight.\n"
    [written] = tool_results(run_id, "write_report")
    assert f"/runs/{run_id}/artifacts/{artifact_id}" in written["content"]
    assert row.result["state"]["artifacts"]["report"]["id"] == artifact_id


def test_an_artifact_over_the_bound_is_refused_to_the_model_and_nothing_is_kept(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a bound smaller than any report
    monkeypatch.setenv("NIGHTSHIFT_ARTIFACT_MAX_BYTES", "64")
    get_settings.cache_clear()
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", REPORT).run_id

    # when the run's steps write the report
    for _ in range(20):
        if execute_step(run_id, "test-worker").outcome is not StepOutcome.CONTINUE:
            break

    # then the model got one clear error, and no report was kept or named in the state
    [written, *_] = tool_results(run_id, "write_report")
    assert written["is_error"] is True
    assert "over the 64-byte artifact limit (NIGHTSHIFT_ARTIFACT_MAX_BYTES)" in written["content"]
    assert "nothing was kept" in written["content"]
    assert "report" not in [name for name, _ in artifact_rows(run_id)]
    assert "report" not in (run_row(run_id).state or {}).get("artifacts", {})


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def old_artifact(run_id: uuid.UUID, name: str, path: Path, sha256: str) -> None:
    """An artifacts row as the release before 0026 wrote it: a path and a hash."""
    with transaction() as session:
        session.execute(
            text(
                "INSERT INTO artifacts (run_id, name, path, sha256, size, media_type) "
                "VALUES (:run_id, :name, :path, :sha256, 10, 'text/markdown')"
            ),
            {"run_id": run_id, "name": name, "path": str(path), "sha256": sha256},
        )


def test_migration_0026_moves_the_files_in_and_reports_the_missing_ones(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # given a database of the release before, whose rows name files under the data dir (the
    # paths a worker wrote, here from another host's data dir: only the file names count)
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", REPORT).run_id
    dispose_all()
    command.downgrade(alembic_config(db_url), "0025")
    folder = get_settings().data_dir / "artifacts" / str(run_id)
    folder.mkdir(parents=True)
    report, changed = b"# Report\n\nfine\n", b"# Summary\n"
    (folder / "report-1.txt").write_bytes(report)
    (folder / "summary-2.txt").write_bytes(changed + b"edited")
    elsewhere = Path("/srv/worker-host/nightshift/artifacts") / str(run_id)
    old_artifact(run_id, "report", elsewhere / "report-1.txt", sha256(report))
    old_artifact(run_id, "summary", elsewhere / "summary-2.txt", sha256(changed))
    old_artifact(run_id, "notes", elsewhere / "notes-3.txt", "0" * 64)

    # when the upgrade runs
    dispose_all()
    with caplog.at_level(logging.WARNING, logger="nightshift.migrate"):
        upgrade(db_url)

    # then the file that is there moved into its row, and the others are reported, not fatal
    with transaction() as session:
        rows = {
            a.name: a for a in session.scalars(select(Artifact).where(Artifact.run_id == run_id))
        }
        contents = {name: a.content for name, a in rows.items()}
    assert contents == {"report": report, "summary": None, "notes": None}
    assert "no longer matched its hash" in str(rows["summary"].missing)
    assert "was not in the data dir" in str(rows["notes"].missing)
    logged = caplog.text
    assert "moved 1 artifact file(s)" in logged and "2 artifact file(s) missing" in logged
    assert "notes-3.txt" in logged and "summary-2.txt" in logged
    assert read_artifact(run_id, rows["report"].id).text == report.decode()
    shown = read_artifact(run_id, rows["notes"].id)
    assert shown.text is None and shown.missing == rows["notes"].missing
    listed = {a["name"]: a["missing"] for a in show_run(run_id)["artifacts"]}
    assert listed == {"report": None, "summary": rows["summary"].missing,
                      "notes": rows["notes"].missing}  # fmt: skip

    # and a downgrade writes the contents back out as files the release before reads
    dispose_all()
    command.downgrade(alembic_config(db_url), "0025")
    with transaction() as session:
        paths = dict(
            session.execute(text("SELECT name, path FROM artifacts WHERE run_id = :r"),
                            {"r": run_id}).all()
        )  # fmt: skip
    assert Path(paths["report"]).read_bytes() == report
    dispose_all()
    upgrade(db_url)
