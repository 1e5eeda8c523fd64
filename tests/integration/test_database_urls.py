"""Each multi-host PostgreSQL URL form works end to end with its first host dead: a worker runs
a run, `start --wait` and the API's `?wait=` LISTEN for it, and `watch` follows it.
(tests/unit/test_postgres_urls.py: how each form is read, and the forms refused.)"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy.engine import make_url

from models import RunStatus
from pipeline.runs.start import start_run
from tests.integration.api_fixtures import AUTH, live_server, make_app
from tests.integration.conftest import ProcessFactory
from tests.integration.test_wait import listeners
from tests.servers import free_port
from tests.support import ServiceUrls, nightshift, wait_for, wait_for_status

FORMS = {
    "libpq URI": "postgresql://{user}@{dead},{alive}/{db}",
    "libpq lists": (
        "postgresql://{user}@/{db}?host={dead_host},{alive_host}&port={dead_port},{alive_port}"
        "&target_session_attrs=read-write"
    ),
    "SQLAlchemy": "postgresql+psycopg://{user}@/{db}?host={dead}&host={alive}",
    "key=value": (
        "host={dead_host},{alive_host} port={dead_port},{alive_port} dbname={db} user={user}"
    ),
}
SLOW_RUN = {"steps": 3, "model_seconds": 0.7}


def url_in_form(form: str, services: ServiceUrls, db_url: str) -> str:
    """This test's database in `form`, a host where nothing listens named before it."""
    alive = urlsplit(services.database)
    userinfo = alive.netloc.rsplit("@", 1)[0] if "@" in alive.netloc else "postgres"
    alive_host, alive_port = alive.hostname or "127.0.0.1", alive.port or 5432
    dead_port = free_port()
    return FORMS[form].format(
        user=userinfo,
        db=make_url(db_url).database,
        dead=f"127.0.0.1:{dead_port}",
        alive=f"{alive_host}:{alive_port}",
        dead_host="127.0.0.1",
        dead_port=dead_port,
        alive_host=alive_host,
        alive_port=alive_port,
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("form", FORMS)
def test_a_url_naming_a_dead_host_first_works_end_to_end(
    form: str,
    services: ServiceUrls,
    db_url: str,
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given every process configured with the form, its first host dead
    monkeypatch.setenv("NIGHTSHIFT_DATABASE_URL", url_in_form(form, services, db_url))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    processes("w1", concurrency=4)

    # then `start --wait` listens for its run and exits once it succeeded
    started = nightshift("start", "bench", "--input", json.dumps(SLOW_RUN), "--wait", "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["status"] == RunStatus.SUCCEEDED.value, started.stdout
    assert "pooler" not in started.stderr, started.stderr

    # and the API's ?wait= listens (its LISTEN seen on the live host) until the run succeeds
    run_id = start_run("bench", SLOW_RUN).run_id
    answer: dict[str, Any] = {}

    def wait(base: str) -> None:
        answer["response"] = httpx.get(f"{base}/runs/{run_id}?wait=60", headers=AUTH, timeout=70)

    with live_server(make_app()) as base:
        waiter = threading.Thread(target=wait, args=(base,))
        waiter.start()
        wait_for(lambda: listeners() >= 1, timeout=20, what="the API's waiter to listen")
        waiter.join(timeout=70)
    assert answer["response"].json()["run"]["status"] == RunStatus.SUCCEEDED.value

    # and `watch` follows a run to its end
    third = start_run("bench", SLOW_RUN).run_id
    watched = nightshift("watch", str(third), "--timeout", "60")
    assert watched.returncode == 0, watched.stderr
    assert wait_for_status(third, {RunStatus.SUCCEEDED.value}, timeout=5)
    assert "succeeded" in watched.stdout, watched.stdout
