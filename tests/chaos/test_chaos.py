"""The chaos harness, short: two and a half minutes of faults of every kind on real workers on
three worker hosts (network namespaces: partitions need root, which CI has), then no duplicate
side effect, no lost or stuck run, no worker exit nobody caused, and the metrics printed.

It runs `nightshift chaos` as a subprocess: the harness starts (and restarts) its own
PostgreSQL and Redis, so it must not share this session's Celery app or services.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.chaos.faults import default_weights, kind_names, parse_weights
from pipeline.chaos.hosts import unavailable
from pipeline.chaos.plan import plan_faults, schedule_hash

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
# Its plan strikes with every kind by +73 s, and has a 17 s model outage (529) at +58 s: a kind
# planned only near the end (seed 2's lying_service at +136 s) was never reached in CI once the
# injector fell behind the plan (a failover waits for its standby's rebuild).
SEED = 130
DURATION = 150
RATE = 16  # 40 faults: fewer than the default, every kind at least once
HOSTS = 3
METRIC_LINES = (
    "faults injected",
    "completion rate",
    "resumption rate",
    "time to resume",
    "duplicate-action rate",
    "stale writes refused",
    "model waits",
)


def test_the_same_seed_plans_the_same_faults_and_every_kind_appears() -> None:
    weights = parse_weights(default_weights())

    first = plan_faults(SEED, DURATION, RATE, weights, lease_seconds=3)
    again = plan_faults(SEED, DURATION, RATE, weights, lease_seconds=3)
    other = plan_faults(SEED + 1, DURATION, RATE, weights, lease_seconds=3)

    assert first == again and schedule_hash(first) == schedule_hash(again)
    assert schedule_hash(first) != schedule_hash(other)
    assert len(first) == 40 and {f.kind for f in first} == set(kind_names())
    assert [f.at for f in first] == sorted(f.at for f in first)


@pytest.mark.timeout(900)
@pytest.mark.skipif(
    unavailable() is not None,
    reason=f"worker hosts for partitions: {unavailable()} (CI runs this as root)",
)
def test_faults_of_every_kind_lose_no_run_and_repeat_no_side_effect() -> None:
    # given a clean environment: the harness brings its own services and sandbox URLs
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTSHIFT_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "pipeline.cli", "chaos", "--json"]
    argv += ["--duration", str(DURATION), "--seed", str(SEED), "--rate", str(RATE)]
    argv += ["--hosts", str(HOSTS)]

    # when kills, freezes, restarts, partitions, broker wipes, slow and lying services, a model
    # outage, duplicate messages, double webhook deliveries and a poison run (the workload's
    # first) fly for two and a half minutes
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=840)

    # then every kind was injected, nothing was lost, stuck or done twice
    assert done.stdout.strip(), f"no report; stderr:\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout)
    story = f"{report['text']}\n\nprogress:\n{done.stderr[-3000:]}"
    assert {kind for kind, count in report["faults"].items() if count} == set(kind_names()), story
    assert report["duplicates"] == 0 and report["duplicate_keys"] == [], story
    assert report["missing_effects"] == [], story
    assert report["lost"] == [] and report["stuck"] == [], story
    assert report["approvals"]["doubled"] == 0, story
    assert report["approvals"]["replays_accepted"] == 0, story
    assert report["unexpected_exits"] == [], story
    assert report["hosts"] == HOSTS and report["resumption_rate"] == 1.0, story
    # and the runs waited out the model outage: some waited, none gave up on the model
    assert report["model_waits"]["n"] > 0 and report["model_unavailable"] == 0, story
    # and the poison run the workload starts first (alone) killed its worker until it failed
    # crashed_worker, as every poison run that ended did
    poison = report["poison"]
    assert poison.get("failed crashed_worker", 0) >= 1, story
    assert poison["workers_killed"] > 0, story
    assert report["passed"] and done.returncode == 0, story
    # and the metrics are printed
    for line in METRIC_LINES:
        assert line in report["text"], story
    assert report["completion_rate"] is not None and report["duplicate_rate"] == 0
    assert set(report["resume_seconds"]) == {"p50", "p95", "max", "n"}
    assert report["resume_seconds"]["n"] > 0, story
    shutil.rmtree(Path(report["logs"]).parent)  # kept when the test fails, for the story
