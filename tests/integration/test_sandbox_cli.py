"""`nightshift sandbox up | status | down`: the reference services in the background for a
trial without Docker, their URLs as export lines, and nothing left running after `down`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import psutil


def nightshift(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv],
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def exported(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    assert all(line.startswith("export NIGHTSHIFT_") for line in lines), stdout
    pairs = (line.removeprefix("export ").split("=", 1) for line in lines)
    return {name: shlex.split(value)[0] for name, value in pairs}  # as the shell reads them


def test_sandbox_up_prints_exports_a_shell_can_eval_and_down_leaves_nothing(
    tmp_path: Path,
) -> None:
    dir = tmp_path / "sandbox"
    # when the sandbox is started twice
    first = nightshift("sandbox", "up", "--dir", str(dir))
    again = nightshift("sandbox", "up", "--dir", str(dir))
    try:
        # then stdout is only export lines, the same both times (one sandbox), and they work
        urls = exported(first.stdout)
        # the shipped agents the services stand in for are turned on with them
        assert urls.pop("NIGHTSHIFT_SHIPPED_AGENTS") == "all"
        assert set(urls) == {"NIGHTSHIFT_WEB_URL", "NIGHTSHIFT_EMAIL_URL",
                             "NIGHTSHIFT_PRICING_URL", "NIGHTSHIFT_GITHOST_URL",
                             "NIGHTSHIFT_CONFIG_PATCH_GIT_URL"}  # fmt: skip
        assert urls["NIGHTSHIFT_CONFIG_PATCH_GIT_URL"].endswith("/remotes/{repo}.git")
        assert again.stdout == first.stdout and "already running" in again.stderr
        assert (dir / "sandbox.env").read_text() == first.stdout
        source = httpx.get(f"{urls['NIGHTSHIFT_WEB_URL']}/sources/incidents", timeout=5)
        assert source.status_code == 200
        sent = httpx.post(f"{urls['NIGHTSHIFT_EMAIL_URL']}/emails", timeout=5,
                          json={"to": "ops@example.com", "subject": "s", "body": "b"})  # fmt: skip
        assert sent.status_code < 300
        status = json.loads(nightshift("sandbox", "status", "--dir", str(dir), "--json").stdout)
        assert status["running"] and status["urls"] == urls
        assert status["deliveries"]["email"] == 1
        pid = status["pid"]
    finally:
        down = nightshift("sandbox", "down", "--dir", str(dir))
    # and down stops it
    assert f"stopped the sandbox (pid {pid})" in down.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert "no sandbox runs" in nightshift("sandbox", "status", "--dir", str(dir)).stdout
    assert not (dir / "sandbox.env").exists()
