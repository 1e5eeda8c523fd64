"""`nightshift demo` as a newcomer runs it: nothing configured, so on the embedded default, in
a data directory of its own. It runs twice in a row, one at a time (a second one at once says
so in one line), and every other ending (Ctrl-C, a database it cannot reach) is one line with
nothing it started left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pipeline import embedded
from tests.support import wait_for

DEMO = [sys.executable, "-m", "pipeline.cli", "demo"]


def newcomer(data_dir: Path) -> dict[str, str]:
    """A shell with nothing of nightshift's set but where its data goes (and the shipped
    schedules off, as in every test: a test at 02:00 Berlin time must not fire one)."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTSHIFT_", "ANTHROPIC_"))}
    return kept | {
        "NIGHTSHIFT_DATA_DIR": str(data_dir),
        "NIGHTSHIFT_SCHEDULES_FILE": os.environ["NIGHTSHIFT_SCHEDULES_FILE"],
    }


def started_by(demo_pid: int, data_dir: Path) -> list[str]:
    """Processes a demo started that still run: its workers (named `w1.<pid>@host`), its beat
    and the embedded servers (whose command lines name the data directory)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if f".{demo_pid}@" in line or (str(data_dir) in line and process.pid != demo_pid):
            found.append(line)
    return found


def test_the_demo_runs_twice_in_a_row_and_a_second_one_at_once_says_one_is_running(
    data_dir: Path,
) -> None:
    # given a newcomer's first demo, started and holding its data directory's lock
    env = newcomer(data_dir)
    first = subprocess.Popen(DEMO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    lock = data_dir / "demo" / "demo.lock"
    wait_for(lambda: lock.exists() and lock.read_text() == str(first.pid), timeout=60,
             what="the first demo to take the lock")  # fmt: skip

    # when a second demo starts at once
    second = subprocess.run(DEMO, env=env, capture_output=True, text=True, timeout=120)

    # then it says in one line that one is running, and the first finishes the story
    assert (second.returncode, second.stdout) == (1, ""), second
    assert second.stderr == f"nightshift demo: a demo is already running (pid {first.pid})\n"
    out, err = first.communicate(timeout=400)
    assert first.returncode == 0, out + err
    assert "emails delivered: 1" in out and "Traceback" not in out + err
    assert started_by(first.pid, data_dir) == []

    # when the newcomer runs it again: a second story of its own, not the first one's email
    again = subprocess.Popen(DEMO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    out, err = again.communicate(timeout=400)
    assert again.returncode == 0, out + err
    assert "emails delivered: 1" in out and "Traceback" not in out + err
    assert started_by(again.pid, data_dir) == []


def test_ctrl_c_ends_the_demo_in_one_line_and_stops_what_it_started(data_dir: Path) -> None:
    # given a demo in the middle of its story (workers running, the run under way)
    output = data_dir.parent / "demo.out"
    with output.open("w") as out:
        demo = subprocess.Popen(DEMO, env=newcomer(data_dir), stdout=out,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        wait_for(lambda: "started nightly_report run" in output.read_text(), timeout=120,
                 what="the demo's run to start")  # fmt: skip

        # when the newcomer presses Ctrl-C
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=120)

    # then the demo ends with one line (after its log of the servers it started and stopped)
    # and no traceback, and nothing it started runs on
    assert demo.returncode == 130
    assert err.splitlines()[-1] == "nightshift demo: interrupted; stopped what it had started"
    assert "Traceback" not in output.read_text() + err
    assert started_by(demo.pid, data_dir) == []
    assert not any(info.running for info in embedded.status(data_dir))


@pytest.mark.parametrize(
    ("what", "said"),
    [
        ("a database it cannot reach",
         "cannot reach the database at 127.0.0.1:1/nightshift (NIGHTSHIFT_DATABASE_URL)"),
        ("a data directory that is a file", "NotADirectoryError: "),
    ],
)  # fmt: skip
def test_a_demo_that_cannot_start_says_why_in_one_line(
    data_dir: Path, what: str, said: str
) -> None:
    # given a database URL it cannot reach (with a password), or a file where the data goes
    env = newcomer(data_dir)
    if what == "a database it cannot reach":
        env |= {"NIGHTSHIFT_DATABASE_URL": "postgresql://ns:s3cret-pw@127.0.0.1:1/nightshift",
                "NIGHTSHIFT_BROKER_URL": os.environ["NIGHTSHIFT_BROKER_URL"]}  # fmt: skip
    else:
        data_dir.parent.joinpath("file").write_text("")
        env["NIGHTSHIFT_DATA_DIR"] = str(data_dir.parent / "file")
    # when the demo starts
    done = subprocess.run(DEMO, env=env, capture_output=True, text=True, timeout=120)
    # then it says why in one line, never the password, and no traceback
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert "s3cret-pw" not in done.stderr
    # but keeps one for a bug report where the line says, unless the cause is a known one
    kept = re.search(r"\(the traceback is in (.+)\)$", done.stderr.strip())
    assert (kept is not None) == (what == "a data directory that is a file")
    if kept is not None:
        path = Path(kept.group(1))
        assert "Traceback" in path.read_text()
        path.unlink()
