"""Fixtures for tests that run real worker and beat processes against the sandbox services."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from pipeline import embedded
from pipeline.processes.celery_process import CeleryProcess
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.git_repos import seed_demo_repository, url_template
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.responders import agent_responder
from pipeline.sandbox.web import WebSandbox
from tests.integration.compose_fixtures import launch  # noqa: F401 (a fixture: compose commands)
from tests.integration.worker_hosts import two_hosts  # noqa: F401 (a fixture: two worker hosts)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory for the embedded servers, stopped and removed after the test. Not
    tmp_path: as root, postgres runs as another user that must traverse the path, and every
    pytest session that starts resets /tmp/pytest-of-<user> to 0700."""
    path = Path(tempfile.mkdtemp(prefix="nightshift-embedded-")) / "data"
    yield path
    embedded.stop(path)  # never leave a server behind, even when the test failed
    shutil.rmtree(path.parent)


@dataclass
class Sandbox:
    web: WebSandbox
    messages: MessagesSandbox
    email: EmailSandbox


@pytest.fixture
def sandbox(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    """Web and Messages API services; workers use the real anthropic SDK against the latter."""
    from pipeline.settings import get_settings

    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    email = EmailSandbox(log_path=tmp_path / "email.jsonl").start()
    messages = MessagesSandbox(
        responder=agent_responder, log_path=tmp_path / "messages.jsonl"
    ).start()
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", web.url)
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_URL", email.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-secret")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", messages.url)
    monkeypatch.setenv("NIGHTSHIFT_MODEL_TIMEOUT", "2")
    get_settings.cache_clear()
    yield Sandbox(web, messages, email)
    email.stop()
    messages.stop()
    web.stop()


@pytest.fixture
def pricing(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PricingSandbox]:
    """The price book, beside the web and Messages API services."""
    from pipeline.settings import get_settings

    service = PricingSandbox(log_path=tmp_path / "pricing.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_PRICING_URL", service.url)
    get_settings.cache_clear()
    yield service
    service.stop()


@pytest.fixture
def githost(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GitHostSandbox]:
    """The git host service alone (pull requests); the scripted model answers."""
    from pipeline.settings import get_settings

    sandbox = GitHostSandbox(log_path=tmp_path / "githost.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_GITHOST_URL", sandbox.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    yield sandbox
    sandbox.stop()


ProcessFactory = Callable[..., CeleryProcess]


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessFactory]:
    """Start real celery worker/beat processes; all are stopped at the end of the test."""
    started: list[CeleryProcess] = []

    def start(name: str, *, beat: bool = False, wait: bool = True, **options: Any) -> CeleryProcess:
        log_path = tmp_path / f"{name}.log"
        process = CeleryProcess(name=name, log_path=log_path, beat=beat, **options)
        started.append(process)
        return process.start(wait=wait)

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def git_remotes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Bare repositories standing in for the git host's remotes, the demo repository (a seeded
    bug, a failing test) among them; Patch clones from and pushes to them."""
    root = tmp_path / "remotes"
    seed_demo_repository(root)
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_PATCH_GIT_URL", url_template(root))
    return root


@dataclass
class Services:
    web: WebSandbox
    githost: GitHostSandbox


@pytest.fixture
def services_up(
    db_url: str, git_remotes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Services]:
    """The web and git host sandboxes, and the remotes Patch pushes to; the scripted model
    (no API key) answers."""
    from pipeline.settings import get_settings

    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    githost = GitHostSandbox(log_path=tmp_path / "githost.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", web.url)
    monkeypatch.setenv("NIGHTSHIFT_GITHOST_URL", githost.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    yield Services(web, githost)
    githost.stop()
    web.stop()


def opened_pulls(githost: GitHostSandbox) -> list[dict]:
    return [entry for entry in githost.log.entries() if entry["action"] == "opened"]


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "oncall_digest"
"""A user's agent package (its own pyproject, its agent registered by entry point)."""


@pytest.fixture(scope="module")
def example_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`pip install examples/oncall_digest`, as a user would, into a directory of its own on
    PYTHONPATH (and this process's sys.path) rather than into the venv running the tests: the
    suite's other processes (pytest-xdist, their workers) would otherwise find its entry point
    without its module on their path and refuse to start."""
    from pipeline.registry import registry

    target = tmp_path_factory.mktemp("oncall-digest-installed")
    subprocess.run([sys.executable, "-m", "pip", "-q", "install", "--no-deps", "--target",
                    str(target), str(EXAMPLE)], check=True, timeout=300)  # fmt: skip
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), before) if p)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    registry.cache_clear()
    yield
    sys.path.remove(str(target))
    if before is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = before
    registry.cache_clear()


@pytest.fixture(scope="session")
def celery_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of a virtual environment with only celery[redis] (the version this suite
    runs): another team's service, with no nightshift installed."""
    venv = tmp_path_factory.mktemp("celery-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"celery[redis]=={version('celery')}"],
        check=True,
        timeout=300,
    )
    yield python
