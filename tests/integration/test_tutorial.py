"""docs/agents.md's night and first deploy (issue 33), run as a reader would: the blocks marked
`<!-- tutorial: PATH -->` are written to a package of their own and its tests run in a pytest
of their own (pipeline.testing, on this session's PostgreSQL); the schedule is read by the
schedules file's reader; every command of the deploy is parsed by the real `nightshift`."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from pipeline.cli.main import parse
from pipeline.runs.schedule_list import load_schedules

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
MARKED = re.compile(r"<!-- tutorial: (\S+) -->\n```\w*\n(.*?)```", re.S)


def tutorial_blocks() -> dict[str, str]:
    return dict(MARKED.findall(TUTORIAL.read_text()))


def test_the_nights_code_runs_and_its_tests_pass(tmp_path: Path) -> None:
    # given the package the tutorial builds: its night module and its tests, as written
    blocks = tutorial_blocks()
    assert {"oncall_digest/night.py", "tests/test_night.py"} <= set(blocks)
    (tmp_path / "oncall_digest").mkdir()
    (tmp_path / "oncall_digest" / "__init__.py").write_text("")
    (tmp_path / "tests").mkdir()
    for name in ("oncall_digest/night.py", "tests/test_night.py"):
        (tmp_path / name).write_text(blocks[name])
    # when the reader runs its tests
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_night.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # then every one of them passes
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-2000:]


def test_the_nights_schedule_is_a_schedules_file_entry(tmp_path: Path) -> None:
    path = tmp_path / "schedules.json"
    path.write_text(tutorial_blocks()["schedules.json"])
    (night,) = [s for s in load_schedules(path) if s.name == "oncall-night"]
    assert night.agent == "oncall_summary" and night.params["teams"][0] == "ops"
    assert json.loads(path.read_text())[0]["name"] == "oncall-night"


def test_every_command_of_the_first_deploy_is_a_real_one() -> None:
    lines = [line.split("#")[0].strip() for line in tutorial_blocks()["deploy"].splitlines()]
    commands = [shlex.split(line) for line in lines if line]
    verbs = [argv[1] for argv in commands if argv[0] == "nightshift"]
    assert verbs == ["migrate", "check", "beat", "worker", "api", "tokens"]
    for argv in commands:
        if argv[0] == "nightshift":
            parse(argv[1:])  # an unknown verb or option would exit 2 here
        else:
            assert argv[:2] == ["pip", "install"], argv
