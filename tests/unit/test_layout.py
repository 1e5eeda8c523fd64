"""The package's shape (docs/layout.md): the runtime never imports the public-API package itself
(only agents, like users' packages, do)."""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"


def test_the_runtime_imports_modules_not_the_public_api_package() -> None:
    offenders = []
    for path in PIPELINE.rglob("*.py"):
        if "agents" in path.relative_to(PIPELINE).parts or path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "pipeline" and not node.level:
                offenders.append(f"{path.relative_to(PIPELINE.parent)}:{node.lineno}")
    assert not offenders, f"`from pipeline import ...` inside the runtime: {offenders}"


def test_no_test_module_name_is_in_both_unit_and_integration() -> None:
    # One name, one file: `pytest -k`, tracebacks and "which test_registry?" stay unambiguous.
    tests = PIPELINE.parent / "tests"
    unit = {p.name for p in (tests / "unit").glob("test_*.py")}
    integration = {p.name for p in (tests / "integration").glob("test_*.py")}
    assert not unit & integration, f"in both tests/unit and tests/integration: {unit & integration}"
