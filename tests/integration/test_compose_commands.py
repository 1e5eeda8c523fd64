"""Every nightshift command in docker-compose.yml starts, run as written against this
machine's PostgreSQL and Redis (there is no Docker engine here to run the stack itself)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import httpx
import psutil

from tests.integration.compose_fixtures import BIN, COMPOSE
from tests.servers import free_port
from tests.support import wait_for

SERVICES = {
    name: spec
    for name, spec in COMPOSE["services"].items()
    if spec.get("command") and spec["command"][0] == "nightshift"
}


def test_compose_lists_the_stack_with_auth_and_health_checks() -> None:
    assert {"postgres", "redis", "migrate", "worker", "beat", "flower", "api"} <= set(
        COMPOSE["services"]
    )
    assert "noeviction" in COMPOSE["services"]["redis"]["command"]
    assert "NIGHTSHIFT_FLOWER_BASIC_AUTH" in COMPOSE["services"]["flower"]["environment"]
    for name in ("postgres", "redis", "worker", "beat", "flower", "api"):
        assert "healthcheck" in COMPOSE["services"][name], name


def test_migrate_runs_to_completion(launch) -> None:
    start, _ = launch
    migrate = start("migrate", SERVICES["migrate"]["command"])
    assert migrate.process.wait(timeout=120) == 0, migrate.log()
    assert "database schema at revision" in migrate.log()


def test_check_passes_before_the_stack_starts_and_fails_it_on_a_problem(launch) -> None:
    start, env = launch
    # given a migrated database and a team's agents (the benchmark ones), no shipped one on
    env["NIGHTSHIFT_SHIPPED_AGENTS"] = ""
    ok = start("check", SERVICES["check"]["command"])
    assert ok.process.wait(timeout=120) == 0, ok.log()
    assert ok.log().startswith("ok: agents bench, bench_synthesis")
    # and every long-running service waits for it to pass
    for name in ("worker", "beat", "flower", "api"):
        waits = COMPOSE["services"][name]["depends_on"]["check"]
        assert waits == {"condition": "service_completed_successfully"}, name
    # when Redis cannot be reached, then it fails, saying so
    env["NIGHTSHIFT_BROKER_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    failed = start("check-no-redis", SERVICES["check"]["command"])
    assert failed.process.wait(timeout=120) == 1, failed.log()
    assert "problem: Redis: cannot reach the broker" in failed.log()


def test_the_worker_starts_and_answers_its_health_check(launch) -> None:
    start, env = launch
    worker = start("worker", SERVICES["worker"]["command"])
    wait_for(lambda: " ready." in worker.log() or not worker.alive(), timeout=60,
             what="the worker to be ready")  # fmt: skip
    assert worker.alive(), worker.log()
    check = SERVICES["worker"]["healthcheck"]["test"]
    assert check[0] == "CMD", check

    def healthy() -> bool:
        result = subprocess.run(check[1:], env=env, capture_output=True, timeout=60)
        return result.returncode == 0

    wait_for(healthy, timeout=60, what="the worker's health check to pass")


def test_beat_starts_and_keeps_its_schedule_file_fresh(launch, tmp_path: Path) -> None:
    start, _ = launch
    beat = start("beat", SERVICES["beat"]["command"])
    wait_for(lambda: "beat: Starting" in beat.log() or not beat.alive(), timeout=60,
             what="beat to start")  # fmt: skip
    assert beat.alive(), beat.log()
    wait_for(lambda: list((tmp_path / "data").glob("celerybeat-schedule*")), timeout=30,
             what="beat's schedule file")  # fmt: skip


def test_flower_starts_with_basic_auth(launch) -> None:
    start, _ = launch
    port = free_port()
    argv = [str(port) if part == "5555" else part for part in SERVICES["flower"]["command"]]
    flower = start("flower", argv)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert flower.alive(), flower.log()
        try:
            return httpx.get(f"{base}/healthcheck", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=60, what="flower to answer")
    assert httpx.get(f"{base}/", timeout=5).status_code == 401
    assert httpx.get(f"{base}/", auth=("ops", "night-owl"), timeout=5).status_code == 200


def test_flower_listens_on_this_machine_only_unless_told_otherwise(launch) -> None:
    start, _ = launch
    port = free_port()
    flower = start("flower-local", [str(BIN / "nightshift"), "flower", "--port", str(port)])

    def listening() -> set[str]:
        assert flower.alive(), flower.log()
        with contextlib.suppress(psutil.Error):
            sockets = psutil.Process(flower.process.pid).net_connections(kind="tcp")
            return {c.laddr.ip for c in sockets if c.status == psutil.CONN_LISTEN}
        return set()

    assert wait_for(listening, timeout=60, what="flower to listen") == {"127.0.0.1"}
    # and the compose file's Flower, in its container, listens on every address
    assert SERVICES["flower"]["command"][2:4] == ["--address", "0.0.0.0"]


def test_flower_refuses_to_start_without_auth(launch) -> None:
    _, env = launch
    env.pop("NIGHTSHIFT_FLOWER_BASIC_AUTH")
    result = subprocess.run(
        SERVICES["flower"]["command"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "NIGHTSHIFT_FLOWER_BASIC_AUTH" in result.stderr


def test_the_api_starts_and_answers_its_health_check(launch) -> None:
    start, env = launch
    port = free_port()
    argv = [str(port) if part == "8000" else part for part in SERVICES["api"]["command"]]
    api = start("api", argv)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert api.alive(), api.log()
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, timeout=60, what="the API to answer /healthz")
    assert httpx.get(f"{base}/runs", timeout=5).status_code == 401
    token = {"Authorization": f"Bearer {env['NIGHTSHIFT_API_TOKEN']}"}
    assert httpx.get(f"{base}/runs", headers=token, timeout=5).status_code == 200
