"""Importing any module reads no settings, starts no server and prints nothing: the embedded
services start when a command that needs them runs, and Celery reads its configuration when it
configures itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import models, pipeline

names = ["celeryconfig", "beat_schedule"]
for package in (pipeline, models):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        # A __main__ module is a program (importing it runs it); migrations are Alembic's
        # scripts, run inside its context.
        if module.name.rpartition(".")[2] != "__main__" and ".migrations" not in module.name:
            names.append(module.name)
for name in names:
    importlib.import_module(name)

import psutil
from pipeline.settings import get_settings

with open(sys.argv[1], "w") as report:
    json.dump(
        {
            "imported": len(names),
            "settings_read": get_settings.loaded,
            "children": [p.name() for p in psutil.Process().children(recursive=True)],
        },
        report,
    )
"""


def fresh_process(
    code: str, tmp_path: Path, *args: str, settings: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Python outside the repository with only these settings and an empty data dir (no
    service URLs unless given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_")}
    env |= {"NIGHTSHIFT_DATA_DIR": str(tmp_path / "data"), **(settings or {})}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_importing_every_module_starts_nothing_and_prints_nothing(tmp_path: Path) -> None:
    # given no URLs set and an empty data dir, when a fresh process imports every module
    report = tmp_path / "report.json"
    done = fresh_process(IMPORT_EVERYTHING, tmp_path, str(report))

    # then nothing was printed, no settings were read and no server was started
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    found = json.loads(report.read_text())
    assert found["imported"] > 100
    assert found["settings_read"] is False
    assert found["children"] == []
    assert not (tmp_path / "data").exists()


def test_importing_the_tasks_starts_nothing(tmp_path: Path) -> None:
    done = fresh_process("import pipeline.tasks", tmp_path)

    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not (tmp_path / "data").exists()


def test_celery_reads_its_urls_when_it_configures_itself(tmp_path: Path) -> None:
    # given URLs that are set, when the app is imported and then configured
    code = (
        "import pipeline.tasks\n"
        "from pipeline.settings import get_settings\n"
        "assert not get_settings.loaded\n"
        "from pipeline.app import app\n"
        "print(app.conf.broker_url, app.conf.task_default_queue,\n"
        "      app.tasks['pipeline.step'].max_retries)\n"
    )
    settings = {
        "NIGHTSHIFT_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
        "NIGHTSHIFT_BROKER_URL": "redis://127.0.0.1:1/3",
        "NIGHTSHIFT_QUEUE": "elsewhere",
        "NIGHTSHIFT_WORKER_LOST_MAX_RETRIES": "7",
    }
    done = fresh_process(code, tmp_path, settings=settings)

    # then Celery's configuration follows them (nothing connects until a message is sent)
    assert done.stderr == ""
    assert done.stdout.split() == ["redis://127.0.0.1:1/3", "elsewhere", "7"]
