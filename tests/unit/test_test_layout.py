"""The tests are laid out as the package is: integration tests in one folder per room, what tests
share in ``tests/support``, fixtures and hooks alone in ``conftest.py``. Each rule walks the whole
tree, so a test added later is held to it too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
TESTS = ROOT / "tests"
INTEGRATION = TESTS / "integration"


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_test_module_imports_another() -> None:
    """What two tests share lives in tests/support, not in one of them."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _test_files()
        for module in _imports(path)
        if module.startswith(("tests.unit", "tests.integration", "tests.deploy"))
    ]
    assert not wrong, wrong


def test_integration_folders_mirror_the_package() -> None:
    """Each folder of tests/integration is named for a room of the package (or the client)."""
    assert not list(INTEGRATION.glob("test_*.py")), "integration tests live in a room's folder"
    for folder in (p for p in INTEGRATION.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        relative = folder.relative_to(INTEGRATION)
        room = ROOT / "service" / relative
        elsewhere = ROOT.joinpath(*relative.parts) if relative.parts[0] == "workers" else None
        client = relative.parts[0] == "client"
        assert room.is_dir() or (elsewhere and elsewhere.is_dir()) or client, relative


def test_no_test_file_name_is_used_twice() -> None:
    """A unit test and an integration test of the same name are told apart by what they check."""
    seen: dict[str, Path] = {}
    for path in _test_files():
        other = seen.setdefault(path.name, path)
        assert other == path, f"{other.relative_to(ROOT)} and {path.relative_to(ROOT)}"


def test_conftest_holds_fixtures_and_hooks_only() -> None:
    """A public function of a conftest is a fixture or a pytest hook; helpers live in support."""
    for conftest in TESTS.rglob("conftest.py"):
        for node in ast.parse(conftest.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
            fixture = any(d.endswith("fixture") for d in decorators)
            hook = node.name.startswith("pytest_")
            where = f"{conftest.relative_to(ROOT)}: {node.name}"
            assert fixture or hook, f"{where} belongs in tests/support"
