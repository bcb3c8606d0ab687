"""The documents a span reports, read from the shapes instrumentations write them in.

- OpenInference flattens each document into attributes:
  ``retrieval.documents.<i>.document.{id,content,score,metadata}`` (and the same under
  ``reranker.input_documents`` / ``reranker.output_documents``).
- LangChain's OpenInference spans leave out ``document.id``; the ids are in ``output.value``, the
  JSON of the returned ``Document`` objects, which is used when it lines up with the attributes.
- Traceloop (OpenLLMetry) writes a task's return value as JSON in ``traceloop.entity.output``; for
  a LlamaIndex retriever that is a list whose items are themselves JSON strings of
  ``NodeWithScore`` objects.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from service.ingest.otlp.rules import as_mapping


@dataclass(frozen=True)
class Document:
    id: str | None
    text: str | None
    score: float | None
    metadata: Mapping[str, object] | None


def openinference_documents(attributes: Mapping[str, object], prefix: str) -> list[Document]:
    """The documents under ``<prefix>.<i>.document.*``, in index order."""
    start = prefix + "."
    fields: dict[int, dict[str, object]] = {}
    for key, value in attributes.items():
        if not key.startswith(start):
            continue
        index, _, rest = key[len(start) :].partition(".")
        # ASCII digits only: str.isdigit() also takes "²" or "٣", which int() refuses.
        if index.isascii() and index.isdigit() and rest.startswith("document."):
            fields.setdefault(int(index), {})[rest[len("document.") :]] = value
    return [
        Document(
            id=_identifier(found.get("id")),
            text=_text(found.get("content")),
            score=_number(found.get("score")),
            metadata=as_mapping(found.get("metadata")),
        )
        for _, found in sorted(fields.items())
    ]


def ids_from_output(output: object, documents: list[Document]) -> list[str | None]:
    """Document ids from a JSON ``{"documents": [...]}`` output that matches ``documents``.

    An id counts only where the output lists the same number of documents and the one at that
    rank has the same text, so a truncated or unrelated output never misassigns an id.
    """
    none: list[str | None] = [None] * len(documents)
    decoded = as_mapping(output)
    listed = decoded.get("documents") if decoded is not None else None
    if not isinstance(listed, list) or len(listed) != len(documents):
        return none
    ids: list[str | None] = []
    for item, document in zip(listed, documents, strict=True):
        if not isinstance(item, dict) or item.get("page_content") != document.text:
            return none
        ids.append(_identifier(item.get("id")))
    return ids


def traceloop_documents(output: object) -> list[Document]:
    """Documents from a task's JSON output; empty unless every item reads as a document."""
    items = _decoded(output)
    if not isinstance(items, list):
        return []
    documents: list[Document] = []
    for raw in items:
        item = _decoded(raw)  # the items are JSON strings inside the JSON list
        if not isinstance(item, dict):
            return []
        document = _node_document(item)
        if document is None:
            return []
        documents.append(document)
    return documents


def _node_document(item: Mapping[str, object]) -> Document | None:
    nested = item.get("node")
    node: Mapping[str, object] = nested if isinstance(nested, dict) else item
    text = next(
        (node[k] for k in ("text", "page_content", "content") if isinstance(node.get(k), str)),
        None,
    )
    if not isinstance(text, str):
        return None
    identifier = next(
        (found for k in ("id_", "id", "node_id") if (found := _identifier(node.get(k)))), None
    )
    metadata = node.get("metadata")
    return Document(
        id=identifier,
        text=text,
        score=_number(item.get("score")),
        metadata=metadata if isinstance(metadata, dict) else None,
    )


def _decoded(value: object) -> object:
    if isinstance(value, str):
        try:
            decoded: object = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return decoded
    return value


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _identifier(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None
