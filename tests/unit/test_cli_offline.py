"""Commands that need no database: argument parsing (options nightshift does not know reach
celery unchanged, and only there), `nightshift agents`, the commands' help, and what Flower's
kwargs column shows of a step."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.cli.main import build_parser, main, parse
from pipeline.registry import registry
from pipeline.settings import get_settings


@pytest.fixture
def typed_agent_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("NIGHTSHIFT_AGENTS", "tests.fixture_agents:TYPED_REMINDERS")
    registry.cache_clear()
    get_settings.cache_clear()
    yield
    monkeypatch.delenv("NIGHTSHIFT_AGENTS")
    registry.cache_clear()
    get_settings.cache_clear()


def test_a_worker_passes_celery_options_through_in_their_order() -> None:
    args = parse(["worker", "-I", "my_module", "-Q", "reports", "--concurrency", "4", "-Ofair"])
    assert args.concurrency == 4
    assert args.celery_args == ["-I", "my_module", "-Q", "reports", "-Ofair"]
    assert parse(["beat", "--", "--max-interval", "5"]).celery_args == ["--max-interval", "5"]
    assert parse(["flower", "--port", "5556", "--url_prefix=ops"]).celery_args == [
        "--url_prefix=ops"
    ]


def test_other_commands_still_refuse_options_they_do_not_know(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["runs", "--colour"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --colour" in capsys.readouterr().err


def test_start_help_points_to_the_agents_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["start", "--help"])
    assert "`nightshift agents` lists the registered agents" in capsys.readouterr().out


def test_agents_lists_every_agent_with_its_package_tools_and_input(
    typed_agent_registered: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agents", "--json"]) == 0
    agents = {agent["name"]: agent for agent in json.loads(capsys.readouterr().out)}

    # the shipped agents come from nightshift's own entry points, a user's from where it was named
    report = agents["nightly_report"]
    assert report["package"].startswith("nightshift ")
    assert report["registered_by"] == "entry point 'nightly_report' of nightshift"
    assert report["prompt_version"] == registry().agent("nightly_report").prompt_version
    assert report["input_schema"]["required"] == ["team", "date"]
    email = next(t for t in report["tools"] if t["name"] == "send_report_email")
    assert email["side_effect"]["service"] == "email" and email["side_effect"]["lookup"]
    assert not email["requires_approval"]
    pull = next(t for t in agents["patch"]["tools"] if t["name"] == "open_fix_pull_request")
    assert pull["requires_approval"] and pull["side_effect"]["service"] == "githost"
    typed = agents["typed_reminders"]
    assert typed["package"] == "tests.fixture_agents"
    assert typed["tools"][0]["typed"] and typed["tools"][0]["side_effect"] is None

    # and the text marks side effects and approvals
    assert main(["agents"]) == 0
    shown = capsys.readouterr().out
    assert "typed_reminders  (tests.fixture_agents, tests.fixture_agents:TYPED_REMINDERS)" in shown
    assert "open_fix_pull_request  side effect on githost; lookup; needs approval" in shown
    assert "input: team* (string), date* (string)" in shown


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    # given `nightshift agents --json | head -c 0`: the reading end is closed before the
    # command writes
    read_end, write_end = os.pipe()
    command = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "agents", "--json"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    os.close(read_end)
    _, err = command.communicate(timeout=60)
    # then it ends as a shell's SIGPIPE would, and says nothing
    assert command.returncode == 141
    assert err == ""


def test_each_command_module_adds_the_commands_the_dispatcher_lists_for_it() -> None:
    import argparse
    import importlib

    from pipeline.cli.main import COMMAND_MODULES

    for module, listed in COMMAND_MODULES.items():
        added: list[str] = []
        sub = argparse.ArgumentParser().add_subparsers()

        def add(
            name: str, handler: object, help: str, added: list[str] = added, sub: Any = sub
        ) -> object:
            added.append(name)
            return sub.add_parser(name)

        importlib.import_module(module).register(add)
        assert tuple(added) == listed, module


def test_a_command_imports_only_its_own_module() -> None:
    import subprocess
    import sys

    probe = (
        "import sys; from pipeline.cli.main import build_parser; build_parser(['agents']); "
        "print('fastapi' in sys.modules, 'pipeline.cli.demo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_no_two_commands_share_a_help_text() -> None:
    # `nightshift --help` lists every command with its help: two alike say nothing of either
    parser = build_parser(["--help"])
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    assert len(helps) > 20 and len(set(helps.values())) == len(helps), helps
    assert str(helps["cleanup"]).startswith("the same as `nightshift retention`")


def test_flowers_kwargs_column_shows_a_childs_batch_before_the_long_run_id() -> None:
    from pipeline.step_messages import step_kwargs_repr

    run_id = "caa20fdb-0000-4000-8000-000000000001"
    batch = "competitor-monitor:2026-11-30T07:00:00+00:00"
    child = {"run_id": run_id, "agent": "competitor_monitor", "step": 2, "batch": batch}
    shown = step_kwargs_repr(child)
    assert shown.startswith(
        f"{{'agent': 'competitor_monitor', 'step': 2, 'run': 'caa20fdb', 'batch': '{batch}', "
    )
    assert ast.literal_eval(shown) == child | {"run": "caa20fdb"}  # Flower's search reads it
    alone = step_kwargs_repr(child | {"batch": None})
    assert alone.startswith(
        "{'agent': 'competitor_monitor', 'step': 2, 'run': 'caa20fdb', 'run_id'"
    )
