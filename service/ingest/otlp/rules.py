"""Where an event's app, retriever, environment and k come from: ordered rules, first match wins.

A rule is one of:

- ``attr:<key>``: a span attribute; ``resource:<key>``: a resource attribute. When ``<key>`` is not
  an attribute itself, a leading part of it may name an attribute that holds a JSON object, and the
  rest is looked up inside: ``attr:metadata.ls_retriever_name`` reads ``ls_retriever_name`` in the
  JSON of the ``metadata`` attribute (where LangChain and OpenInference put the run's metadata).
- ``name``: the span name; ``class``: the span name up to its first dot
  (``VectorIndexRetriever.retrieve`` gives ``VectorIndexRetriever``); ``scope``: the
  instrumentation scope's name.
- ``const:<text>``: a fixed value.

Settings check every rule against this grammar at startup (``OTLP_RULE_PATTERN``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from service.ingest.otlp.decode import Span


def lookup(attributes: Mapping[str, object], path: str) -> object:
    """The value at ``path``: an attribute, or a key inside an attribute holding a JSON object."""
    if path in attributes:
        return attributes[path]
    parts = path.split(".")
    # Longest attribute name first: attribute names contain dots themselves.
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if head not in attributes:
            continue
        nested = as_mapping(attributes[head])
        if nested is not None:
            found = lookup(nested, ".".join(parts[cut:]))
            if found is not None:
                return found
    return None


def as_mapping(value: object) -> Mapping[str, object] | None:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            decoded = json.loads(value)
        except (ValueError, RecursionError):
            return None
        return decoded if isinstance(decoded, dict) else None
    return None


def rule_value(rule: str, span: Span) -> object:
    kind, _, argument = rule.partition(":")
    if kind == "attr":
        return lookup(span.attributes, argument)
    if kind == "resource":
        return lookup(span.resource, argument)
    if kind == "const":
        return argument
    if rule == "name":
        return span.name
    if rule == "class":
        return span.name.split(".", 1)[0]
    if rule == "scope":
        return span.scope
    raise ValueError(f"invalid rule {rule!r}")


def resolve_text(rules: Sequence[str], span: Span) -> str | None:
    """The first rule giving a non-empty text (numbers count as their text)."""
    for rule in rules:
        value = rule_value(rule, span)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            return str(value)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def resolve_int(rules: Sequence[str], span: Span) -> int | None:
    """The first rule giving a whole number (an int, an integral float, or digits)."""
    for rule in rules:
        value = rule_value(rule, span)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            text = value.strip()
            digits = text.removeprefix("-")
            # ASCII and short: int() refuses "²" and is slow on thousands of digits.
            if digits.isascii() and digits.isdigit() and len(digits) <= 18:
                return int(text)
    return None
