"""Bare git repositories that stand in for a git host's remotes, and the demo repository with
a seeded bug: a shop whose line totals are not rounded to cents, and a test that says so."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from pipeline.settings import child_environment

DEMO_REPO = "acme/shop"
DEMO_FILE = "shop/cart.py"
DEMO_FILES = {
    "README.md": "# shop\n\nLine totals for the checkout. Run the tests: `python -m unittest`.\n",
    "shop/__init__.py": "",
    DEMO_FILE: (
        '"""Line totals for the checkout."""\n'
        "\n"
        "\n"
        "def line_total(price: float, quantity: int) -> float:\n"
        '    """What a line of the order costs, in dollars and cents."""\n'
        "    total = price * quantity\n"
        "    return total\n"
    ),
    "tests/__init__.py": "",
    "tests/test_cart.py": (
        "import unittest\n"
        "\n"
        "from shop.cart import line_total\n"
        "\n"
        "\n"
        "class LineTotalTest(unittest.TestCase):\n"
        "    def test_a_total_is_in_cents(self):\n"
        "        self.assertEqual(line_total(0.1, 3), 0.3)\n"
        "\n"
        "    def test_a_whole_number_of_dollars(self):\n"
        "        self.assertEqual(line_total(2.0, 3), 6.0)\n"
    ),
}
IDENTITY = {
    "GIT_AUTHOR_NAME": "Acme Developer",
    "GIT_AUTHOR_EMAIL": "dev@acme.example",
    "GIT_COMMITTER_NAME": "Acme Developer",
    "GIT_COMMITTER_EMAIL": "dev@acme.example",
    "GIT_AUTHOR_DATE": "2026-11-01T09:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-11-01T09:00:00+00:00",
}


def remote_path(root: Path, repo: str) -> Path:
    """Where the bare repository of `owner/name` lives under `root`."""
    return root / f"{repo}.git"


def url_template(root: Path) -> str:
    """The remote URL template (NIGHTSHIFT_CONFIG_PATCH_GIT_URL) for repositories under root."""
    return f"file://{root}/{{repo}}.git"


def create_repository(root: Path, repo: str, files: dict[str, str]) -> Path:
    """A bare repository with one commit of `files` on `main`; an existing one is kept."""
    bare = remote_path(root, repo)
    if (bare / "HEAD").exists():
        return bare
    bare.parent.mkdir(parents=True, exist_ok=True)
    _git("init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=bare.parent)
    with tempfile.TemporaryDirectory(prefix="seed-") as scratch:
        work = Path(scratch)
        _git("init", "--quiet", "--initial-branch=main", cwd=work)
        for name, content in files.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(content, encoding="utf-8")
        _git("add", "--all", cwd=work)
        _git("commit", "--quiet", "-m", "Line totals", cwd=work)
        _git("push", "--quiet", str(bare), "main:refs/heads/main", cwd=work)
    return bare


def seed_demo_repository(root: Path) -> Path:
    return create_repository(root, DEMO_REPO, DEMO_FILES)


def has_branch(root: Path, repo: str, branch: str) -> bool:
    bare = remote_path(root, repo)
    if not (bare / "HEAD").exists():
        return False
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
        cwd=bare,
        capture_output=True,
        check=False,
    )
    return found.returncode == 0


def _git(*args: str, cwd: Path) -> None:
    env = child_environment({**IDENTITY, "GIT_CONFIG_NOSYSTEM": "1"})
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)
