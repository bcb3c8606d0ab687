"""The tree follows the one-way flow: each stage of ``service`` imports only what its package
docstring allows, ``service`` never imports ``workers``, and the measures import nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
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
    "ui": {"store", "measures", "telemetry", "api", "analysis"},
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


def _calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def test_route_dependencies_are_declared_once() -> None:
    """Routes take the aliases of ``service/api/deps.py``; no other module calls ``Depends``."""
    deps = SERVICE / "api" / "deps.py"
    assert any(_called_name(call) == "Depends" for call in _calls(deps))
    wrong = [
        f"{path.relative_to(ROOT)}:{call.lineno}"
        for path in SERVICE.rglob("*.py")
        if path != deps
        for call in _calls(path)
        if _called_name(call) == "Depends"
    ]
    assert not wrong, wrong


def test_rejected_events_are_counted_in_one_place() -> None:
    counting = {
        str(path.relative_to(ROOT))
        for path in [*SERVICE.rglob("*.py"), *(ROOT / "workers").rglob("*.py")]
        for call in _calls(path)
        if _called_name(call) == "inc"
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and call.args[0].value == "events_rejected"
    }
    assert counting == {"service/ingest/counts.py"}


def test_the_client_library_imports_nothing_of_the_service() -> None:
    """It goes into applications that have none of the server's packages (see client/)."""
    sources = list((ROOT / "client" / "retrieval_monitor_client").glob("*.py"))
    assert sources
    for path in sources:
        outside = {
            module
            for module in imported_modules(path)
            if module.split(".")[0] in {"service", "workers", "fastapi", "celery", "sqlmodel"}
        }
        assert not outside, f"{path.name} imports {sorted(outside)}"
