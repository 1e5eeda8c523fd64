"""A run is taken from its lease holder at once only when that process is certainly gone:
never because of a hostname and a pid alone (containers share hostnames, pids are reused)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from pipeline.db import transaction
from pipeline.engine.holders import Holder, holder_here, is_certainly_gone
from pipeline.engine.leases import Lease
from pipeline.runs.start import create_run_txn
from tests.support import claim

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}
_TAKE_OVER = """
import sys, uuid
from pipeline.engine.leases import take
from pipeline.settings import get_settings
print(take(uuid.UUID(sys.argv[1]), "other-worker", 30, get_settings()))
"""


def held_by(owner: str) -> uuid.UUID:
    """A running run whose live lease (30 s) `owner` holds."""
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", RUN_INPUT).run_id
    assert claim(run_id, owner, lease_seconds=30) is not None
    return run_id


def take_over(run_id: uuid.UUID) -> Lease | None:
    """A claim by another worker, while the holder's lease is still live."""
    return claim(run_id, "other-worker", lease_seconds=30)


def exited_process_holder() -> str:
    """The owner string of a real worker process that has exited since."""
    code = "from pipeline.engine.holders import holder_here; print(holder_here('t'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_an_owner_names_host_pid_thread_and_where_its_pid_means_something() -> None:
    me = holder_here("ThreadPoolExecutor-0_1")
    assert Holder.parse(str(me)) == me
    assert me.pid == os.getpid() and me.thread == "ThreadPoolExecutor-0_1"
    assert Holder.parse("host:123:thread") is None  # an older worker's format: never trusted


def test_the_run_of_a_holder_that_exited_is_taken_at_once(db_url: str) -> None:
    run_id = held_by(exited_process_holder())
    lease = take_over(run_id)
    assert lease is not None and lease.fence == 2


def test_a_live_holder_keeps_its_run(db_url: str) -> None:
    run_id = held_by(str(holder_here("worker-thread")))
    assert take_over(run_id) is None


def test_a_reused_pid_does_not_make_the_holder_look_alive(db_url: str) -> None:
    # given a holder whose pid now names another process (this one, started at another time)
    me = holder_here("t")
    reused = dataclasses.replace(me, started=me.started - 100)
    assert is_certainly_gone(str(reused))
    # and an owner in an older format (host:pid:thread) is never declared dead
    assert not is_certainly_gone(f"{me.host}:999999:t")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) for a pid namespace (a container's view of pids)",
)
def test_a_worker_in_another_pid_namespace_with_the_same_hostname_waits_for_the_lease(
    db_url: str,
) -> None:
    # given a run held by this process (alive), and a worker in a container of its own: the
    # same hostname, but a pid namespace in which this process's pid does not exist
    run_id = held_by(str(holder_here("worker-thread")))
    container = ["unshare", "--pid", "--fork", "--mount-proc"]
    exists = f"import os; print(os.path.exists('/proc/{os.getpid()}'))"
    probe = [*container, sys.executable, "-c", exists]
    seen = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    assert seen == "False", "the holder's pid must be absent there for this test to mean much"

    # when that worker finds the run's message and tries to take over from a "dead" pid
    argv = [*container, sys.executable, "-c", _TAKE_OVER, str(run_id)]
    done = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ), timeout=60)

    # then it does not: a pid from another namespace proves nothing, the lease must lapse
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
    assert take_over(run_id) is None
