"""The agent's tests need no services: every NIGHTSHIFT_* variable is unset and HOME is a fresh
directory, so nothing here can reach (or start) a database, a broker or a worker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def no_services(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in [n for n in os.environ if n.startswith("NIGHTSHIFT_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home
