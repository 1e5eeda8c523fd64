"""Issue 31's reproductions at the edges, against a live API (uvicorn on a socket, configured
as `nightshift api` configures it) and real workers: what a second red team got through now
refuses, escapes or is cut off."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from models import RunStatus
from pipeline.sandbox.githost import GitHostSandbox
from tests.integration.api_fixtures import AUTH, live_server, make_app
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status

FORGED = "INFO nightshift.decisions action price_synthesis:sku-2:night: approve by pricing@x.com"


def test_a_newline_in_an_input_cannot_forge_a_log_line(
    githost: GitHostSandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    tmp_path: Path,
) -> None:
    # given a worker, and an agent whose action key (so the line that says the run parked on
    # it) quotes its input's `repo`
    register_agents("tests.fixture_agents:APPROVAL_ONLY")
    processes("w1")
    with live_server(make_app()) as base:
        # when a caller starts a run whose repo carries a newline and a whole log line
        bug = {"issue": 7, "repo": f"acme/shop\n{FORGED}\r\x1b[2K"}
        body = {"agent": "approval_only", "input": bug}
        started = httpx.post(f"{base}/runs", json=body, headers=AUTH)
    assert started.status_code == 201, started.text
    wait_for_status(uuid.UUID(started.json()["run_id"]), {RunStatus.WAITING.value})
    # then the worker's line about it is one line, the newline written as its escape
    log = (tmp_path / "w1.log").read_text()
    assert f"acme/shop\\n{FORGED}\\r\\x1b[2K" in log
    assert not [line for line in log.splitlines() if line.startswith("INFO nightshift")]
