"""The tests are laid out as the package is: integration tests in one folder per room, what tests
share in ``tests/support``, fixtures and hooks alone in ``conftest.py``, and every module of
``service`` and ``workers`` has tests one can find (a ``test_<module>.py`` in its room's folder, or
its dotted path named in a test file's docstring). Each rule walks the whole tree, so a test or a
module added later is held to it too."""

from __future__ import annotations

import ast
import re
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


# Modules no test exercises on its own; each says why. A module leaves this set when a test names
# it, and the check below fails until it does, so the set only shrinks.
UNTESTED = {
    # Structural types (a Protocol each): they declare what a room reads of the process, and
    # hold no code to run.
    "service.auth.parts",
    "service.telemetry.parts",
    # ``utcnow`` and ``as_utc``: every store and page calls them, no test checks them apart.
    "service.primitives.clock",
    # The process's engine, Redis and aggregates, built lazily from the settings: the app and
    # most integration tests build one, none checks what it builds.
    "service.wiring.runtime",
}
SOURCE_ROOTS = ("service", "workers")
# Not modules a test exercises one by one: migrations' schema steps are checked together by
# tests/integration/store/test_migrations.py; templates and static files are not Python.
NOT_MODULES = ("versions", "templates", "static")
# A paragraph of a test file's docstring that lists what the file tests, e.g. "Tests ``a.b``."
TESTS_PARAGRAPH = re.compile(r"(?:^|\n\s*\n)\s*Tests (.*?)(?=\n\s*\n|\Z)", re.DOTALL)
DOTTED = re.compile(r"``((?:service|workers)\.[\w.]+)``")


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the source trees under ``root``, by dotted path."""
    found: dict[str, Path] = {}
    for top in SOURCE_ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root)
            if path.name == "__init__.py" or set(relative.parts) & set(NOT_MODULES):
                continue
            found[".".join(relative.with_suffix("").parts)] = relative
    return found


def _docstrings(root: Path) -> dict[Path, str]:
    return {
        path: ast.get_docstring(ast.parse(path.read_text())) or ""
        for path in sorted((root / "tests").rglob("test_*.py"))
    }


def _has_named_test(root: Path, relative: Path) -> bool:
    """A ``test_<module>.py`` in the module's room folder, under tests/unit or tests/integration."""
    room = relative.parent.parts[1:] if relative.parts[0] == "service" else relative.parent.parts
    name = f"test_{relative.stem}.py"
    return any(
        (root / "tests" / kind).joinpath(*room, name).is_file() for kind in ("unit", "integration")
    )


def _is_named(dotted: str, relative: Path, docstrings: dict[Path, str]) -> bool:
    # Whole names only: ``service.store.pages`` is not named by ``service.store.pages_cache``.
    either = "|".join(re.escape(name) for name in (dotted, relative.as_posix()))
    pattern = re.compile(rf"(?<![\w./])(?:{either})(?!\w)")
    return any(pattern.search(text) for text in docstrings.values())


def modules_without_tests(root: Path) -> list[str]:
    """The modules under ``root`` that neither a named test file nor a test docstring finds."""
    docstrings = _docstrings(root)
    return [
        dotted
        for dotted, relative in _modules(root).items()
        if not _has_named_test(root, relative) and not _is_named(dotted, relative, docstrings)
    ]


def unknown_modules_in_tests_paragraphs(root: Path) -> list[str]:
    """Names in a docstring's "Tests ..." paragraph that are no module (moved, split, renamed)."""
    modules = _modules(root)
    return [
        f"{path.relative_to(root)}: {name}"
        for path, text in _docstrings(root).items()
        for paragraph in TESTS_PARAGRAPH.findall(text)
        for name in DOTTED.findall(paragraph)
        if name not in modules
    ]


def test_every_module_has_tests_one_can_find() -> None:
    """A newcomer finds a module's tests by its name: a file, or a docstring that names it."""
    missing = sorted(set(modules_without_tests(ROOT)) - UNTESTED)
    assert not missing, (
        "no test file is named for these modules and no test docstring names them; add a line "
        "'Tests ``<module>``.' to the docstring of the test file that exercises each (or, if none "
        "does, list it in UNTESTED with why):\n" + "\n".join(missing)
    )


def test_the_untested_list_holds_only_untested_modules() -> None:
    """A module that gained a test, or no longer exists, leaves UNTESTED."""
    modules, untested = set(_modules(ROOT)), set(modules_without_tests(ROOT))
    assert sorted(UNTESTED - modules) == [], "UNTESTED names modules that do not exist"
    assert sorted(UNTESTED - untested) == [], "UNTESTED names modules a test now finds"


def test_a_tests_paragraph_names_only_modules() -> None:
    """After a module is split or renamed, the docstrings that named it say so here."""
    unknown = unknown_modules_in_tests_paragraphs(ROOT)
    assert not unknown, "these 'Tests ...' names are no module:\n" + "\n".join(unknown)


def _write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_module_check_catches_a_module_without_a_test(tmp_path: Path) -> None:
    """Planted: a tree where one module has no test, others are found each way the rule allows."""
    for name in ("__init__", "named", "dotted", "by_path", "lonely", "lonely_part"):
        _write(tmp_path / "service" / "room" / f"{name}.py")
    _write(tmp_path / "service" / "store" / "migrations" / "versions" / "0001_first.py")
    _write(tmp_path / "workers" / "judge" / "grader.py")
    _write(tmp_path / "tests" / "unit" / "room" / "test_named.py")
    _write(tmp_path / "tests" / "unit" / "workers" / "judge" / "test_grader.py")
    # In another room's folder, a file named for the module does not count.
    _write(tmp_path / "tests" / "unit" / "other" / "test_lonely.py")
    _write(
        tmp_path / "tests" / "integration" / "other" / "test_flows.py",
        '"""A flow.\n\nTests ``service.room.dotted``, ``service.room.lonely_part`` and '
        '``service.room.gone``.\n"""\n\n# service.room.lonely, in a comment only\n',
    )
    _write(
        tmp_path / "tests" / "integration" / "room" / "test_more.py",
        '"""What ``service/room/by_path.py`` does."""\n',
    )

    assert modules_without_tests(tmp_path) == ["service.room.lonely"]
    assert unknown_modules_in_tests_paragraphs(tmp_path) == [
        "tests/integration/other/test_flows.py: service.room.gone"
    ]
