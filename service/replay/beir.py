"""Reading a dataset in the BEIR layout: corpus.jsonl, queries.jsonl and qrels/<split>.tsv."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str

    @property
    def full_text(self) -> str:
        """Title and body as one passage, the way retrievers usually index BEIR corpora."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True)
class BeirDataset:
    corpus: dict[str, Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def load_beir(path: Path, split: str = "test") -> BeirDataset:
    """Load a BEIR dataset, keeping only the queries that have judgments in ``split``."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"BEIR dataset folder not found: {path}")
    corpus_file = _require(path / "corpus.jsonl")
    queries_file = _require(path / "queries.jsonl")
    qrels_file = _require(path / "qrels" / f"{split}.tsv")

    corpus: dict[str, Document] = {}
    for line_no, record in _read_jsonl(corpus_file):
        doc_id = _string_field(record, "_id", corpus_file, line_no)
        corpus[doc_id] = Document(
            doc_id=doc_id,
            title=str(record.get("title") or ""),
            text=str(record.get("text") or ""),
        )

    qrels = _read_qrels(qrels_file)
    queries: dict[str, str] = {}
    for line_no, record in _read_jsonl(queries_file):
        query_id = _string_field(record, "_id", queries_file, line_no)
        if query_id in qrels:
            queries[query_id] = str(record.get("text") or "")
    # Judgments for queries the queries file lacks cannot be replayed, so they are dropped here
    # rather than surprising every caller.
    qrels = {query_id: judged for query_id, judged in qrels.items() if query_id in queries}
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels)


def _require(file: Path) -> Path:
    if not file.is_file():
        raise FileNotFoundError(f"BEIR dataset is missing {file.name}: expected {file}")
    return file


def _read_jsonl(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with file.open(encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file}:{line_no}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{file}:{line_no}: expected a JSON object")
            yield line_no, record


def _string_field(record: dict[str, Any], name: str, file: Path, line_no: int) -> str:
    value = record.get(name)
    if value is None or value == "":
        raise ValueError(f"{file}:{line_no}: record has no {name!r}")
    return str(value)


def _read_qrels(file: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with file.open(encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            fields = line.rstrip("\n").split("\t")
            if line_no == 1 and fields[0] == "query-id":
                continue
            if not line.strip():
                continue
            if len(fields) != 3:
                raise ValueError(
                    f"{file}:{line_no}: expected query-id<TAB>corpus-id<TAB>score, "
                    f"got {len(fields)} fields"
                )
            query_id, doc_id, score = fields
            try:
                relevance = int(float(score))
            except ValueError as exc:
                raise ValueError(f"{file}:{line_no}: score {score!r} is not a number") from exc
            qrels.setdefault(query_id, {})[doc_id] = relevance
    return qrels
