"""The tree follows the one-way flow: each stage of ``service`` imports only what its package
docstring allows, ``service`` never imports ``workers``, and the measures import nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "service"
# The root modules (settings, runtime, schemas, queue, cli...) wire the stages together; any stage
# but the measures may use them.
ROOT_MODULES = {p.stem for p in SERVICE.glob("*.py") if p.stem != "__init__"}
STAGES = {p.name for p in SERVICE.iterdir() if (p / "__init__.py").exists()}
ALLOWED: dict[str, set[str]] = {
    "measures": set(),
    "store": {"measures"},
    "telemetry": {"store", "measures"},
    "ingest": {"store", "telemetry", "measures"},
    "spend": {"store", "telemetry"},
    "analysis": {"store", "measures"},
    "ui": {"store", "measures", "telemetry", "api"},
    "replay": {"store", "spend", "analysis"},
    "api": STAGES,
}


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def stage_of(module: str) -> str | None:
    """The stage (or ``root:<module>``) a dotted name of the project belongs to."""
    parts = module.split(".")
    if parts[0] != "service" or len(parts) < 2:
        return None
    if parts[1] in STAGES:
        return parts[1]
    return f"root:{parts[1]}" if parts[1] in ROOT_MODULES else None


def test_every_stage_has_a_rule_and_a_docstring() -> None:
    assert set(ALLOWED) == STAGES
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((SERVICE / stage / "__init__.py").read_text()))
        assert doc, f"service/{stage}/__init__.py has a docstring"
        assert "import" in doc, f"service/{stage}/__init__.py says what it may import"


def test_few_modules_at_the_root() -> None:
    assert len(ROOT_MODULES) <= 12, sorted(ROOT_MODULES)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stage_imports_only_what_it_may(stage: str) -> None:
    wrong: list[str] = []
    for path in (SERVICE / stage).rglob("*.py"):
        for module in imported_modules(path):
            target = stage_of(module)
            if target is None or target == stage:
                continue
            if target.startswith("root:"):
                if stage == "measures":
                    wrong.append(f"{path.relative_to(ROOT)} imports {module}")
                continue
            if target not in ALLOWED[stage]:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, wrong


def test_service_never_imports_workers() -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in SERVICE.rglob("*.py")
        for module in imported_modules(path)
        if module.split(".")[0] == "workers"
    ]
    assert not wrong, wrong
