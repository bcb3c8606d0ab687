"""Every in-process cache of the package is found from the source and either goes through
``service.primitives.bounded_cache`` (keys are digests, the budget is in bytes) or is listed below
with why it cannot grow with client text. A cache added later fails here until it does one or
the other.

What counts as a cache, found with ``ast``: a function under ``functools.lru_cache`` or
``functools.cache``; a module-level dict, set, list or their kin written to from a function; an
attribute made such a container and written to from a method other than ``__init__`` (on the
instance or as a dataclass field).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.primitives.bounded_cache import (
    ENTRY_OVERHEAD_BYTES,
    MAX_KEY_BYTES,
    BoundedCache,
    KeyTooLargeError,
)
from tests.support.paths import REPO_ROOT

PACKAGES = ("service", "workers")
_CONTAINER_CALLS = {"dict", "set", "list", "OrderedDict", "defaultdict", "Counter", "deque"}
_FUNCTOOLS_CACHES = {"lru_cache", "cache"}
_WRITING_METHODS = {"setdefault", "update", "add", "append", "extend", "appendleft", "insert"}

# Each entry: what it is keyed by, and why that cannot grow with what clients send.
ALLOWED: dict[str, str] = {
    "service/config/settings.py:get_settings": "no arguments: one Settings object",
    "service/store/engine.py:get_engine": "keyed by a database URL from the settings; 4 entries",
    "service/store/event_rows.py:_processors": "keyed by the dialect: two exist; 4 entries",
    "service/store/event_rows.py:_postgres_columns": "keyed by the dialect; 4 entries",
    "service/store/event_rows.py:_postgres_statement_with_passages": "keyed by the dialect",
    "service/store/dialect.py:_unnested_insert": (
        "keyed by a table of the schema and the column names the store's code writes (the "
        "row dicts' keys, never a client's); 64 entries"
    ),
    "service/telemetry/aggregates.py:Aggregates._series_keys": (
        "the series of the shared aggregates, bounded by the cardinality cap; rebuilt from the "
        "hash when fields leave it"
    ),
    "workers/tasks.py:runtime": "no arguments: one runtime per worker process",
    "workers/tasks.py:_configured_judge": "no arguments: the judge the settings configure",
    "workers/tasks.py:judge_with": (
        "two entries (lru_cache maxsize=2), keyed by the judge settings a re-judge replaces "
        "(only OVERRIDABLE names): an administrator's rejudge command sends them, one set per run"
    ),
    "workers/judge/embedding.py:_blas_thread_limit": "no arguments: the process's BLAS",
    "service/telemetry/aggregates.py:_field": (
        "metric family, label values and part: label values are names the event schema bounds "
        "in length (app, retriever, environment) and in number per tenant (the cardinality cap); "
        "16,384 entries of at most a few hundred bytes"
    ),
    "service/telemetry/aggregates.py:_unfield": "the strings _field made: the same bound",
    "service/telemetry/aggregates.py:_positions": "keyed by a metric family name of the catalogue",
    "service/telemetry/exposition.py:series_labels": (
        "label names and values of exported series: bounded in length by the schema and in "
        "number by the cardinality cap; 16,384 entries, about 13 MiB when full"
    ),
    "service/replay/bm25.py:light_stem": (
        "words of the replay's own corpus (a local data set read by the CLI, never a request); "
        "200,000 entries of one word"
    ),
    "workers/judge/output_mode.py:_known": (
        "keyed by a digest of the configured judge endpoint and model: one entry per judge"
    ),
}


def _source_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((REPO_ROOT / package).rglob("*.py"))


def _called_name(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _is_container(node: ast.expr | None) -> bool:
    if isinstance(node, (ast.Dict, ast.Set, ast.List, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(node, ast.Call):
        name = _called_name(node)
        if name in _CONTAINER_CALLS:
            return True
        # dataclasses.field(default_factory=dict)
        if name == "field":
            return any(
                k.arg == "default_factory" and _called_name(k.value) in _CONTAINER_CALLS
                for k in node.keywords
            )
    return False


def _written(node: ast.AST) -> Iterator[ast.expr]:
    """The containers a node writes into: ``x[k] = v``, ``x[k] += v``, ``x.setdefault(...)``..."""
    for inner in ast.walk(node):
        if isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
            for target in targets:
                if isinstance(target, ast.Subscript):
                    yield target.value
        elif (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr in _WRITING_METHODS
        ):
            yield inner.func.value


def _self_attribute(node: ast.expr) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _functions(node: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield inner


def caches_in(path: Path) -> set[str]:
    """The caches of one module, named ``path:function``, ``path:global`` or ``path:Class.attr``."""
    tree = ast.parse(path.read_text())
    where = path.relative_to(REPO_ROOT).as_posix()
    found: set[str] = set()
    for function in _functions(tree):
        for decorator in function.decorator_list:
            if _called_name(decorator) in _FUNCTOOLS_CACHES:
                found.add(f"{where}:{function.name}")
    module_containers = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and _is_container(statement.value):
            module_containers |= {t.id for t in statement.targets if isinstance(t, ast.Name)}
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and _is_container(statement.value)
        ):
            module_containers.add(statement.target.id)
    for function in _functions(tree):
        for container in _written(function):
            if isinstance(container, ast.Name) and container.id in module_containers:
                found.add(f"{where}:{container.id}")
    for klass in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        attributes = {
            s.target.id
            for s in klass.body
            if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)
            and _is_container(s.value)
        }
        for method in _functions(klass):
            for inner in ast.walk(method):
                if isinstance(inner, (ast.Assign, ast.AnnAssign)) and _is_container(inner.value):
                    targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                    attributes |= {a for t in targets if (a := _self_attribute(t))}
        for method in _functions(klass):
            if method.name == "__init__":
                continue
            for container in _written(method):
                attribute = _self_attribute(container)
                if attribute in attributes:
                    found.add(f"{where}:{klass.name}.{attribute}")
    return found


def all_caches() -> set[str]:
    return {cache for path in _source_files() for cache in caches_in(path)}


# Containers that are written while one piece of work runs and dropped with it: not caches, but
# the walk cannot tell them apart, so each is named with the work that bounds it.
ACCUMULATORS: dict[str, str] = {
    "service/primitives/bounded_cache.py:BoundedCache._entries": "the mechanism itself",
    "service/api/http_metrics.py:HttpResponseCounter._counts": (
        "answers since the last flush, one entry per route template and status class"
    ),
    "service/ingest/counts.py:IngestCounts._sets": (
        "one commit group's counts by label set, added to a Delta and dropped with the group"
    ),
    "service/ingest/group_commit.py:GroupCommitter._queue": (
        "events waiting for their commit, bounded by the backpressure on ingest"
    ),
    "service/ingest/group_commit.py:GroupCommitter._threads": "the committer's own threads",
    "service/primitives/background.py:BackgroundWorker._items": (
        "work handed to a background thread, drained as it runs"
    ),
    "service/replay/workload.py:_Names._used": "names one generated workload has given",
    "workers/calls.py:SliceCalls.finished": "one slice's judged events",
    "workers/calls.py:SliceCalls.over_budget": "one slice's events over budget",
    "workers/calls.py:SliceCalls.transient": "one slice's events to retry",
    "workers/judge/onnx_graph.py:_Builder.initializers": "the tensors of one graph being built",
    "workers/judge/onnx_graph.py:_Builder.nodes": "the nodes of one graph being built",
}


def test_every_cache_is_bounded_in_bytes_or_listed_with_its_reason() -> None:
    unlisted = sorted(all_caches() - ALLOWED.keys() - ACCUMULATORS.keys())
    assert not unlisted, (
        f"in-process caches outside service.primitives.bounded_cache: {unlisted}; key them by a "
        "digest in a BoundedCache, or list them here with why client text cannot grow them"
    )


def test_the_list_names_only_what_exists() -> None:
    stale = sorted((ALLOWED.keys() | ACCUMULATORS.keys()) - all_caches())
    assert not stale, f"listed but not found in the source: {stale}"


def test_the_finder_sees_each_kind_of_cache(tmp_path: Path) -> None:
    """The walk above would pass on an empty finder; here it must find one of each kind."""
    module = REPO_ROOT / "service" / "primitives" / "bounded_cache.py"
    sample = ast.parse(
        "import functools\n"
        "from collections import OrderedDict\n"
        "_seen = {}\n"
        "@functools.lru_cache(maxsize=10)\n"
        "def by_text(text): return text\n"
        "def remember(text): _seen[text] = 1\n"
        "class Lookups:\n"
        "    def __init__(self):\n"
        "        self._found = OrderedDict()\n"
        "    def find(self, text):\n"
        "        self._found.setdefault(text, len(text))\n"
    )
    assert module.exists()
    path = REPO_ROOT / "service" / "sample_caches.py"
    original = Path.read_text

    def read_sample(self: Path, *args: object, **kwargs: object) -> str:
        return ast.unparse(sample) if self == path else original(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "read_text", read_sample)
        found = caches_in(path)
    assert found == {
        "service/sample_caches.py:by_text",
        "service/sample_caches.py:_seen",
        "service/sample_caches.py:Lookups._found",
    }


def test_a_bounded_cache_keeps_its_byte_budget_under_large_values() -> None:
    cache: BoundedCache[str] = BoundedCache(64 * 1024)
    # 20,000 astral characters: about 80 kB as a str, more than the whole budget.
    astral = "".join(chr(0x10000 + i % 50_000) for i in range(20_000))
    assert not cache.put("a" * 64, astral)
    for i in range(1_000):
        cache.put(f"{i:064x}", "\U0001f600" * 500)
        assert cache.bytes_held <= cache.max_bytes
    assert 0 < len(cache) < 1_000
    # The most recent entries stayed, the oldest went.
    assert cache.get(f"{999:064x}") is not None
    assert cache.get(f"{0:064x}") is None
    each = sys.getsizeof(f"{0:064x}") + sys.getsizeof("\U0001f600" * 500) + ENTRY_OVERHEAD_BYTES
    assert len(cache) == cache.max_bytes // each


def test_a_bounded_cache_refuses_a_text_as_key() -> None:
    cache: BoundedCache[int] = BoundedCache(1024 * 1024)
    passage = "a passage a client sent " * 40
    assert sys.getsizeof(passage) > MAX_KEY_BYTES
    with pytest.raises(KeyTooLargeError):
        cache.put(passage, 1)


def test_a_bounded_cache_forgets_least_recently_used_first() -> None:
    cache: BoundedCache[int] = BoundedCache(3 * (sys.getsizeof("k0") + 28 + ENTRY_OVERHEAD_BYTES))
    for key in ("k0", "k1", "k2"):
        cache.put(key, 1000)
    assert cache.get("k0") == 1000  # k0 now the most recent: k1 goes next
    cache.put("k3", 1000)
    assert "k1" not in cache
    assert {"k0", "k2", "k3"} == {k for k in ("k0", "k1", "k2", "k3") if k in cache}
