"""The tree follows the one-way flow: every room of ``service`` and ``workers`` imports only what
its rule (and its package docstring) allows, ``service`` never imports ``workers``, the primitives
and the measures import nothing of the project, the primitives nothing beyond the standard
library, and ``service`` has no module outside a room."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
SERVICE = ROOT / "service"
WORKERS = ROOT / "workers"


def _rooms() -> set[str]:
    found = {f"service.{p.name}" for p in SERVICE.iterdir() if (p / "__init__.py").exists()}
    found |= {"workers"} | {
        f"workers.{p.name}" for p in WORKERS.iterdir() if (p / "__init__.py").exists()
    }
    return found


ROOMS = _rooms()
SERVICE_ROOMS = {room for room in ROOMS if room.startswith("service.")}
# What each room may import of the project, lowest first. The primitives and the measures import
# nothing; the configuration stands on the primitives, the wire contract and the queue on both;
# the process supervision and the command line sit on top; the workers are a tree of their own
# that the service never imports, and they reach the judge queue through ``service.queue``, never
# through ingest.
FOUNDATION = {"service.primitives", "service.config", "service.contract", "service.queue"}
ALLOWED: dict[str, set[str]] = {
    "service.primitives": set(),
    "service.measures": set(),
    "service.config": {"service.primitives"},
    "service.contract": {"service.primitives", "service.config"},
    "service.queue": {"service.primitives", "service.config"},
    "service.store": {
        "service.primitives",
        "service.config",
        "service.contract",
        "service.measures",
    },
    "service.telemetry": {
        "service.primitives",
        "service.config",
        "service.queue",
        "service.store",
        "service.measures",
    },
    "service.wiring": FOUNDATION | {"service.store", "service.telemetry"},
    "service.ingest": FOUNDATION
    | {"service.store", "service.telemetry", "service.measures", "service.wiring"},
    "service.spend": {
        "service.primitives",
        "service.config",
        "service.store",
        "service.telemetry",
        "service.wiring",
    },
    "service.analysis": {
        "service.primitives",
        "service.config",
        "service.store",
        "service.measures",
    },
    "service.auth": FOUNDATION | {"service.store", "service.wiring", "service.ingest"},
    "service.http": FOUNDATION
    | {
        "service.store",
        "service.telemetry",
        "service.wiring",
        "service.ingest",
        "service.spend",
        "service.analysis",
        "service.auth",
    },
    "service.replay": FOUNDATION
    | {
        "service.store",
        "service.spend",
        "service.analysis",
        "service.wiring",
        "service.ingest",
    },
    "service.ui": FOUNDATION
    | {
        "service.store",
        "service.measures",
        "service.telemetry",
        "service.analysis",
        "service.auth",
        "service.http",
    },
    "service.api": SERVICE_ROOMS - {"service.api", "service.process", "service.cli"},
    "service.process": SERVICE_ROOMS - {"service.process", "service.cli"},
    "service.cli": SERVICE_ROOMS - {"service.cli"},
    "workers": FOUNDATION
    | {
        "service.store",
        "service.telemetry",
        "service.measures",
        "service.wiring",
        "service.spend",
        "workers.judge",
    },
    "workers.judge": {
        "service.primitives",
        "service.config",
        "service.store",
        "service.measures",
    },
}
# Rooms held to the standard library: no third-party import at all.
STANDARD_LIBRARY_ONLY = ("service.primitives",)


def imported_modules(path: Path) -> set[str]:
    return imported_modules_of(path.read_text())


def imported_modules_of(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def room_of(module: str) -> str | None:
    """The room a dotted name of the project belongs to; None outside the project."""
    parts = module.split(".")
    if parts[0] not in {"service", "workers"}:
        return None
    if len(parts) >= 2 and f"{parts[0]}.{parts[1]}" in ROOMS:
        return f"{parts[0]}.{parts[1]}"
    return parts[0] if parts[0] == "workers" else module


def room_of_path(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return room_of(".".join(parts)) or str(path)


def sources_of(room: str) -> list[tuple[Path, str]]:
    folder = ROOT.joinpath(*room.split("."))
    files = folder.rglob("*.py") if room != "workers" else folder.glob("*.py")
    return [(path, path.read_text()) for path in sorted(files)]


def violations(room: str, sources: list[tuple[Path, str]]) -> list[str]:
    wrong: list[str] = []
    for path, source in sources:
        for module in imported_modules_of(source):
            target = room_of(module)
            if target is None or target == room:
                continue
            if target not in ALLOWED[room]:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    return wrong


def test_every_room_has_a_rule_and_a_docstring() -> None:
    assert set(ALLOWED) == ROOMS
    for room in ROOMS:
        init = ROOT.joinpath(*room.split("."), "__init__.py")
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(ROOT)} has a docstring"
        if room != "workers":
            assert "import" in doc, f"{init.relative_to(ROOT)} says what it may import"


def test_the_rules_have_no_cycle() -> None:
    """A room reaches itself through no chain of allowed imports: the flow is one way."""
    for start in ALLOWED:
        seen: set[str] = set()
        frontier = set(ALLOWED[start])
        while frontier:
            room = frontier.pop()
            assert room != start, f"{start} reaches itself"
            if room not in seen:
                seen.add(room)
                frontier |= ALLOWED[room]


def test_no_module_at_the_root_of_service() -> None:
    assert [p.name for p in SERVICE.glob("*.py")] == ["__init__.py"]


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_a_room_imports_only_what_it_may(room: str) -> None:
    wrong = violations(room, sources_of(room))
    assert not wrong, wrong


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_a_planted_import_is_caught_in_every_room(room: str) -> None:
    """The check is not vacuous: one forbidden import added to a room's files is reported."""
    forbidden = sorted(({"workers"} | ROOMS) - ALLOWED[room] - {room})
    assert forbidden, f"{room} may import everything"
    folder = ROOT.joinpath(*room.split("."))
    planted = (folder / "planted.py", f"import {forbidden[0]}.anything\n")
    assert violations(room, [*sources_of(room), planted]) == [
        f"{planted[0].relative_to(ROOT)} imports {forbidden[0]}.anything"
    ]


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
    """Routes take the aliases of ``service/http/deps.py``; no other module calls ``Depends``."""
    deps = SERVICE / "http" / "deps.py"
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


def third_party_imports(sources: list[tuple[Path, str]]) -> list[str]:
    """Imports of anything that is neither the standard library nor the project."""
    allowed = set(sys.stdlib_module_names) | {"service", "__future__"}
    return sorted(
        f"{path.relative_to(ROOT)} imports {module}"
        for path, source in sources
        for module in imported_modules_of(source)
        if module.split(".")[0] not in allowed
    )


@pytest.mark.parametrize("room", STANDARD_LIBRARY_ONLY)
def test_the_primitives_import_only_the_standard_library(room: str) -> None:
    assert not third_party_imports(sources_of(room))


@pytest.mark.parametrize("room", STANDARD_LIBRARY_ONLY)
def test_a_planted_third_party_import_is_caught(room: str) -> None:
    folder = ROOT.joinpath(*room.split("."))
    planted = (folder / "planted.py", "from redis import Redis\n")
    assert third_party_imports([*sources_of(room), planted]) == [
        f"{planted[0].relative_to(ROOT)} imports redis",
        f"{planted[0].relative_to(ROOT)} imports redis.Redis",
    ]
