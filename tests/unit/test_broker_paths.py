"""Every way to the judge queue goes to ``RM_BROKER_URL``'s broker (``judge_broker_url``), read
from the code: each Celery app, judge sender and queue reader the service and the workers build
is given the broker's URL, and Redis list commands (how a Redis broker holds a queue) appear only
in the two modules that speak for the broker. A path added later that reached the queue through
the aggregates' Redis, which is the same server only when no broker is set apart, fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

SOURCES = sorted((REPO_ROOT / "service").rglob("*.py")) + sorted(
    (REPO_ROOT / "workers").rglob("*.py")
)
# The broker's own speakers: the queue reader, the judge message and its sender.
LIST_COMMANDS_ALLOWED_IN = {
    REPO_ROOT / "service" / "queue" / "broker.py",
    REPO_ROOT / "service" / "ingest" / "judge_queue.py",
    REPO_ROOT / "service" / "queue" / "messages.py",
}
LIST_COMMANDS = {
    "lpush",
    "rpush",
    "llen",
    "lrange",
    "lpop",
    "rpop",
    "blpop",
    "brpop",
    "lrem",
    "lmove",
}
# What builds a way to the queue, and which argument carries the broker's URL.
QUEUE_BUILDERS: dict[str, str | int] = {
    "Celery": "broker",
    "JudgeQueue": 0,
    "BrokerQueues": 0,
    "celery_sender": 0,
}


def _calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _argument(call: ast.Call, where: str | int) -> ast.expr | None:
    if isinstance(where, int):
        if len(call.args) > where:
            return call.args[where]
        return None
    return next((k.value for k in call.keywords if k.arg == where), None)


def test_the_sources_are_found() -> None:
    assert len(SOURCES) > 100
    builders = {_name(c) for path in SOURCES for c in _calls(path)} & set(QUEUE_BUILDERS)
    assert builders == set(QUEUE_BUILDERS)  # each is built somewhere, so each is checked


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_way_to_the_queue_is_given_the_brokers_url(path: Path) -> None:
    for call in _calls(path):
        name = _name(call)
        if name in LIST_COMMANDS:
            assert path in LIST_COMMANDS_ALLOWED_IN, (
                f"{path.name}:{call.lineno}: {name} on a Redis list outside the broker's modules"
            )
        if name in QUEUE_BUILDERS and not (name == "BrokerQueues" and path.name == "broker.py"):
            url = _argument(call, QUEUE_BUILDERS[name])
            assert url is not None, f"{path.name}:{call.lineno}: {name} without a broker URL"
            source = ast.unparse(url)
            # The setting itself, or the parameter that takes it (whose callers are checked too).
            assert source.endswith("judge_broker_url") or source == "broker_url", (
                f"{path.name}:{call.lineno}: {name} given {source}, not the judge broker's URL"
            )
