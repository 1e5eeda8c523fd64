"""The package's shape (docs/layout.md): every module is named there, and the runtime never
imports the public-API package itself (only agents, like users' packages, do)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
INDEX = "### Every module, by package"
_PACKAGE = re.compile(r"- `(?P<dir>[^`]+)/` \((?P<what>[^()]*)\)(?::\s+(?P<modules>.*))?", re.S)


def modules_on_disk() -> set[str]:
    """Every module of pipeline/ and models/ but the packages' __init__ and the migrations'
    history, as `dir/name`."""
    found = set()
    for top in ("pipeline", "models"):
        for path in (ROOT / top).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if path.stem != "__init__" and "versions" not in relative.parts:
                found.add(relative.with_suffix("").as_posix())
    return found


def index_of_layout() -> tuple[set[str], set[str]]:
    """(packages, modules) docs/layout.md's index names, as `dir` and `dir/name`."""
    text = (ROOT / "docs" / "layout.md").read_text().partition(INDEX)[2]
    items = re.split(r"\n(?=- `)", text.strip().partition("\n\n")[2].strip())
    packages, modules = set(), set()
    for item in items:
        matched = _PACKAGE.fullmatch(item.strip())
        assert matched, f"not a package line of the index: {item!r}"
        packages.add(matched["dir"])
        for name in re.findall(r"`([^`]+)`", matched["modules"] or ""):
            modules.add(f"{matched['dir']}/{name}")
    return packages, modules


def test_docs_layout_names_every_module_and_no_module_that_is_gone() -> None:
    packages, listed = index_of_layout()
    on_disk = modules_on_disk()

    missing = sorted(on_disk - listed)
    gone = sorted(listed - on_disk)
    assert not missing, f"name these in docs/layout.md ({INDEX}): {missing}"
    assert not gone, f"docs/layout.md ({INDEX}) names modules that are gone: {gone}"
    directories = {module.rpartition("/")[0] for module in on_disk}
    assert directories <= packages, f"packages not in the index: {directories - packages}"
    assert all((ROOT / package).is_dir() for package in packages), packages


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
