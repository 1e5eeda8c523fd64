"""One demo at a time per data directory: the second says who holds it, in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.processes.demo import DemoRunning, _only_demo


def test_a_second_demo_is_refused_naming_the_first(tmp_path: Path) -> None:
    with _only_demo(tmp_path), pytest.raises(DemoRunning) as refused, _only_demo(tmp_path):
        pass
    assert str(refused.value) == f"a demo is already running (pid {os.getpid()})"


def test_the_lock_is_free_again_once_the_demo_ends(tmp_path: Path) -> None:
    with _only_demo(tmp_path):
        pass
    with _only_demo(tmp_path):
        assert (tmp_path / "demo.lock").read_text() == str(os.getpid())
