"""Composite keys are injective, whoever builds them: every builder of
``service/primitives/keys.py`` and every function of the project that returns a key made by it
gives two different inputs two different keys, and no module builds a key or hash input by
formatting or joining strings."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis import Redis

from service.auth import sessions
from service.primitives import keys
from service.primitives.hashing import text_hash
from service.replay import rejudge
from service.spend import budget
from service.store.judging import EventForJudging, JudgeIdentity, PassageForJudging
from service.telemetry import aggregates, cardinality, judged_export
from tests.support.paths import REPO_ROOT
from workers import claims, plan
from workers.judge import output_mode, vectors

# Characters a separator-joined key is fooled by, and the escapes of the encodings used here.
TRICKY = ":|/%\x1f\x00\\\"'[],{}3Aa_.~ "
texts = st.one_of(st.text(alphabet=TRICKY, max_size=4), st.text(max_size=6))
digests = st.builds(text_hash, texts)
small_ints = st.integers(min_value=0, max_value=40)


def structures() -> st.SearchStrategy[keys.Structure]:
    scalars = st.one_of(texts, st.integers(), st.booleans(), st.none())
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)
        ),
        max_leaves=8,
    )


def judging_event(texts_and_k: tuple[list[str], int]) -> EventForJudging:
    passages, k = texts_and_k
    return EventForJudging(
        pk=1,
        event_id="e",
        tenant="t",
        app="a",
        retriever="r",
        environment="",
        query="q",
        k=k,
        status="pending",
        received_at=datetime(2024, 1, 1, tzinfo=UTC),
        gold_passage_ids=None,
        passages=[
            PassageForJudging(rank, f"d{rank}", text, text_hash(text))
            for rank, text in enumerate(passages, start=1)
        ],
    )


def claim_key(judge: str, prompt_version: str, pk: int) -> str:
    who = JudgeIdentity(judge=judge, model=judge, prompt_version=prompt_version)
    # An unconnected client: building a key talks to no server.
    return claims.EventClaims(Redis(), who, 1.0)._key(pk)


def rejudge_plan(
    tenant: str, app: str | None, overrides: dict[str, str], window: str
) -> rejudge.RejudgePlan:
    instant = datetime(2024, 1, 1, tzinfo=UTC)
    return rejudge.RejudgePlan(instant, instant, tenant, app, None, overrides, False, window)


def plan_fields(
    tenant: str, app: str | None, overrides: dict[str, str], window: str
) -> tuple[Any, ...]:
    return (tenant, app, sorted(overrides.items()), window)


# What two inputs of a builder are compared by, and the builder applied to one input.
Builder = tuple[st.SearchStrategy[tuple[Any, ...]], Callable[..., object]]

# The mechanism itself: every public builder of service/primitives/keys.py (``composite_parts``, its
# inverse, is checked below).
MECHANISM: dict[str, Builder] = {
    "composite_key": (st.lists(texts, min_size=1, max_size=4).map(tuple), keys.composite_key),
    "redis_key": (
        st.lists(texts, min_size=1, max_size=4).map(tuple),
        lambda *parts: keys.redis_key("rm:test", *parts),
    ),
    "structured_key": (st.tuples(structures()), keys.structured_key),
    "digest_key": (st.lists(digests, max_size=4).map(tuple), keys.digest_key),
}

# Every function of the project that returns a key built by the mechanism (found below by walking
# the source), with the inputs it takes.
PROJECT: dict[str, Builder] = {
    "service.telemetry.cardinality.label_set_member": (
        st.tuples(texts, texts, texts, texts),
        lambda *labels: cardinality.label_set_member(cardinality.LabelSet(*labels)),
    ),
    "service.telemetry.cardinality.app_member": (st.tuples(texts, texts), cardinality.app_member),
    "service.telemetry.aggregates._field": (
        st.tuples(texts, st.lists(texts, max_size=3).map(tuple), texts),
        aggregates._field,
    ),
    "service.telemetry.judged_export.done_key": (
        st.tuples(small_ints, texts, texts),
        judged_export.done_key,
    ),
    "service.spend.budget.window_keys": (
        st.tuples(texts, texts, st.sampled_from([0.0, 3600.0, 86400.0, 90000.0])),
        budget.window_keys,
    ),
    "service.spend.budget.spenders_key": (
        st.tuples(st.integers(min_value=0, max_value=10**6)),
        budget.spenders_key,
    ),
    "service.auth.sessions.record_key": (st.tuples(texts), sessions.record_key),
    "service.replay.rejudge.RejudgePlan.run_id": (
        st.tuples(texts, st.none() | texts, st.dictionaries(texts, texts, max_size=2), texts),
        lambda *fields: rejudge_plan(*fields).run_id,
    ),
    "service.replay.rejudge.cursor_key": (
        st.tuples(texts, st.none() | texts, st.dictionaries(texts, texts, max_size=2), texts),
        lambda *fields: rejudge.cursor_key(rejudge_plan(*fields)),
    ),
    "workers.plan.context_cache_key": (
        # The rating is of the set of the top k: compared as a set, as the key means it.
        st.tuples(st.lists(texts, min_size=1, max_size=4, unique=True), st.integers(1, 4)).map(
            lambda drawn: (frozenset(drawn[0][: drawn[1]]), *drawn)
        ),
        lambda _top_k, passages, k: plan.context_cache_key(judging_event((passages, k))),
    ),
    "workers.judge.output_mode.mode_key": (st.tuples(texts, texts), output_mode.mode_key),
    "workers.judge.vectors.vector_version": (
        st.tuples(texts, texts, texts, small_ints),
        vectors.vector_version,
    ),
    "workers.judge.vectors.vector_field": (st.tuples(texts, texts), vectors.vector_field),
    "workers.judge.vectors.vector_keys": (
        st.lists(texts, min_size=1, max_size=4).map(lambda parts: (keys.composite_key(*parts),)),
        vectors.vector_keys,
    ),
    "workers.claims.EventClaims._key": (st.tuples(texts, texts, small_ints), claim_key),
}


def compared(name: str, drawn: tuple[Any, ...]) -> tuple[Any, ...]:
    """What makes two inputs of a builder the same input."""
    if name.startswith("service.replay.rejudge."):
        return plan_fields(*drawn)
    if name == "workers.plan.context_cache_key":
        return (drawn[0],)
    if name == "workers.judge.output_mode.mode_key":
        # One endpoint, with or without a trailing slash: meant to give one key.
        return (drawn[0].rstrip("/"), drawn[1])
    return drawn


# Separators a key joined by hand would use; ``shifted`` moves the boundary of two adjacent
# parts across one of them, which is how two inputs of a joined key collide.
SEPARATORS = (":", "|", "/", "\x1f", "\x00", ",", "%3A")


def shifted(drawn: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Inputs next to ``drawn``: one separator more or less at a boundary between two parts
    (also inside a part that is itself a tuple of strings)."""
    variants = []
    for i, value in enumerate(drawn):
        if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            variants += [(*drawn[:i], inner, *drawn[i + 1 :]) for inner in shifted(value)]
        if i + 1 == len(drawn) or not (isinstance(value, str) and isinstance(drawn[i + 1], str)):
            continue
        after = drawn[i + 1]
        for separator in SEPARATORS:
            moved = [(value + separator + after[:1], after[1:]), (value[:-1], value[-1:] + after)]
            if separator in value:
                head, _, tail = value.partition(separator)
                moved.append((head, tail + separator + after))
            variants += [(*drawn[:i], left, right, *drawn[i + 2 :]) for left, right in moved]
    return variants


def assert_injective(name: str, builder: Builder, inputs: Sequence[tuple[Any, ...]]) -> None:
    _, build = builder
    seen: dict[object, tuple[Any, ...]] = {}
    near = [v for drawn in inputs if compared(name, drawn) == drawn for v in shifted(drawn)]
    for drawn in [*inputs, *near]:
        try:
            key = build(*drawn)
        except ValueError:  # a shifted digest is no digest: refused, never a key
            continue
        identity = compared(name, drawn)
        earlier = seen.setdefault(key, identity)
        assert earlier == identity, f"{name}: {earlier!r} and {identity!r} give {key!r}"


BUILDERS = {**{f"service.primitives.keys.{n}": b for n, b in MECHANISM.items()}, **PROJECT}


@pytest.mark.parametrize("name", sorted(BUILDERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_two_different_inputs_never_give_one_key(name: str, data: st.DataObject) -> None:
    strategy, _ = BUILDERS[name]
    assert_injective(name, BUILDERS[name], data.draw(st.lists(strategy, max_size=25)))


@settings(max_examples=300, deadline=None)
@given(st.lists(texts, min_size=1, max_size=5))
def test_a_composite_key_parses_back_into_its_parts(parts: list[str]) -> None:
    assert keys.composite_parts(keys.composite_key(*parts)) == tuple(parts)


def test_separators_in_parts_do_not_merge_keys() -> None:
    assert keys.composite_key("a:b", "c") != keys.composite_key("a", "b:c")
    assert keys.composite_key("a%3Ab") != keys.composite_key("a:b")
    with pytest.raises(ValueError, match="at least one part"):
        keys.composite_key()
    with pytest.raises(ValueError, match="SHA-256"):
        keys.digest_key("ab")


def test_every_public_builder_of_the_mechanism_is_checked() -> None:
    public = {
        name
        for name, value in vars(keys).items()
        if inspect.isfunction(value) and value.__module__ == keys.__name__
        if not name.startswith("_")
    }
    assert public - {"composite_parts"} == set(MECHANISM)


# --- the source: who builds keys, and that nobody builds one by hand -------------------------

SOURCES = ("service", "workers")
MECHANISM_MODULE = Path("service/primitives/keys.py")


def modules() -> list[tuple[str, ast.Module]]:
    found = []
    for root in SOURCES:
        for path in sorted((REPO_ROOT / root).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT)
            if relative == MECHANISM_MODULE or "migrations" in relative.parts:
                continue
            found.append((relative.as_posix(), ast.parse(path.read_text(), str(relative))))
    return found


def functions(tree: ast.Module, module: str) -> list[tuple[str, ast.FunctionDef]]:
    """Every function of a module with its dotted name (methods under their class)."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found.append((f"{module}.{node.name}", node))
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found.append((f"{module}.{node.name}.{item.name}", item))
    return found


def called_name(node: ast.Call) -> str:
    if isinstance(node.func, ast.Name):
        return node.func.id
    return node.func.attr if isinstance(node.func, ast.Attribute) else ""


def returns_a_key(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Return)
        and node.value is not None
        and any(
            isinstance(call, ast.Call) and called_name(call) in MECHANISM
            for call in ast.walk(node.value)
        )
        for node in ast.walk(function)
    )


def test_every_key_builder_of_the_project_is_checked() -> None:
    """A function added later that returns a key must be added to ``PROJECT``, so the property
    above covers it."""
    builders = {
        name
        for path, tree in modules()
        for name, function in functions(tree, path.removesuffix(".py").replace("/", "."))
        if returns_a_key(function)
    }
    assert builders == set(PROJECT)


def walk_outside_the_mechanism(expression: ast.AST) -> list[ast.AST]:
    """The nodes of ``expression``, leaving out the arguments of the mechanism's calls: a part
    formatted from one value (``f"h{hour}"``) is a part, and the mechanism encodes it."""
    found: list[ast.AST] = []
    waiting = [expression]
    while waiting:
        node = waiting.pop()
        found.append(node)
        if isinstance(node, ast.Call) and called_name(node) in MECHANISM:
            continue
        waiting.extend(ast.iter_child_nodes(node))
    return found


def hand_built(expression: ast.AST) -> list[ast.AST]:
    """Strings made by formatting or joining inside ``expression``: an f-string with a value, a
    ``str.join``, ``%`` formatting, or ``+`` with a string constant or a prefix constant."""
    found: list[ast.AST] = []
    for node in walk_outside_the_mechanism(expression):
        if (
            isinstance(node, ast.JoinedStr)
            and any(isinstance(value, ast.FormattedValue) for value in node.values)
        ) or (isinstance(node, ast.Call) and called_name(node) in {"join", "format"}):
            found.append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
            sides = (node.left, node.right)
            if any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides) or any(
                isinstance(s, ast.Name) and s.id.endswith(("PREFIX", "KEY", "NAMESPACE"))
                for s in sides
            ):
                found.append(node)
    return found


def key_expressions(tree: ast.Module) -> list[ast.AST]:
    """Where a key or hash input is made: arguments of hashlib calls and digest updates, of
    Redis calls and scripts (``keys=``, ``args=``), values returned by functions named for
    keys, and values bound to names holding ``key`` or ``prefix``."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and called_name(node) not in MECHANISM:
            receiver = ast.unparse(node.func).lower()
            hashing = receiver.startswith("hashlib.") or (
                called_name(node) == "update" and ("digest" in receiver or "hash" in receiver)
            )
            if hashing or "redis" in receiver or "pipe" in receiver:
                found += [*node.args, *(k.value for k in node.keywords)]
            found += [k.value for k in node.keywords if k.arg in {"keys", "args"}]
        elif isinstance(node, ast.FunctionDef) and "key" in node.name.lower():
            found += [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value]
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = " ".join(ast.unparse(target).lower() for target in targets)
            if "key" in names or "prefix" in names:
                found.append(node.value)
    return found


# Hand-built strings in a key context that are not composite keys of client strings, each with
# why; keyed by (module, source text of the expression).
NOT_COMPOSITE = {
    # The scan pattern of the done markers: a glob, not a key. A key's parts are percent-encoded,
    # so "*" and ":" in a name cannot widen or shift a match.
    ("service/telemetry/aggregates.py", "DONE_PREFIX + '*'"),
    # A namespace with its separator, then one composite key (``done_key``).
    ("service/telemetry/aggregates.py", "DONE_PREFIX + done_key"),
    # A fixed tag and one digest of ``digest_key``: the form stored in the label cache table.
    ("workers/plan.py", "'ctx:' + hashlib.sha256(digest_key(*top_k).encode()).hexdigest()"),
    # One seed (an integer, whose decimal holds no NUL) and one event id: the first NUL splits
    # them back. The order of a seeded sample must stay the same across versions, so the bytes
    # hashed stay as they were.
    ("service/analysis/gold_sample.py", "f'{seed}\\x00{event_id}'"),
    # Values, not keys: a new API key (one random part), the stored passage id of a passage
    # sent without one (one digest), where in an OTLP body a value sits (error messages), and
    # the lines of the exposition format.
    ("service/auth/keys.py", "'rm_' + secrets.token_urlsafe(32)"),
    ("service/store/events.py", "f'sha256:{content_hash[:16]}'"),
    ("service/ingest/otlp/decode.py", "f'{where}.kvlistValue'"),
    ("service/ingest/otlp/decode.py", "f'{where}.kvlistValue.values[{i}].key'"),
    ("service/ingest/otlp/decode.py", "f'{where}[{i}].key'"),
    ("service/ingest/otlp/decode.py", "f'{where}[{i}].value'"),
    ("service/telemetry/exposition.py", "f'{name}_bucket{{'"),
    ("service/telemetry/exposition.py", "f'{name}_bucket{{{labels.before_le},'"),
    # SQL, not a key: a statement naming a day's partition (a name made from constants), which
    # joins on the tenant and event id columns.
    (
        "service/store/partitions.py",
        "f'DELETE FROM event_keys k USING {events_part} e WHERE k.tenant = e.tenant AND "
        "k.event_id = e.event_id AND k.event_pk = e.id'",
    ),
}


def test_no_module_builds_a_key_by_hand() -> None:
    built = sorted(
        {
            (path, ast.unparse(node))
            for path, tree in modules()
            for expression in key_expressions(tree)
            for node in hand_built(expression)
        }
    )
    assert set(built) - NOT_COMPOSITE == set(), "build these with service.primitives.keys"
    assert NOT_COMPOSITE - set(built) == set(), "no longer built by hand: drop from the list"
