"""A small Okapi BM25 index over an in-memory corpus, in plain Python and numpy.

Parameters default to k1=0.9, b=0.4: the values Anserini/Pyserini use for their BEIR "flat"
baselines, tuned on MS MARCO-style short passages. Those baselines are the published figures the
replay corpora are compared with, and a low ``b`` suits abstracts and passages whose length says
little about their topic. The textbook 1.2/0.75 remain one argument away.

Scores follow the classical formula, idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)),
with Lucene's always-positive idf, log(1 + (N - df + 0.5) / (df + 0.5)), so that a term found in
more than half the documents never lowers a score.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

# Function words only: content words that look common ("not", "no", "against") change the
# meaning of claims and questions, so they stay.
# fmt: off
STOPWORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "been", "but", "by", "for", "from", "had", "has",
    "have", "he", "her", "his", "i", "if", "in", "into", "is", "it", "its", "of", "on", "or", "our",
    "she", "so", "such", "than", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "those", "to", "was", "we", "were", "which", "while", "who", "whom", "will", "with",
    "would", "you", "your",
))
# fmt: on

# Letters and digits, with no underscore; \w alone would keep "foo_bar" as one token.
_WORD = re.compile(r"[^\W_]+")
_VOWELS = frozenset("aeiouy")


@lru_cache(maxsize=200_000)
def light_stem(word: str) -> str:
    """Strip plural, -ed, -ing and -ly endings so inflected forms of a word meet.

    Deliberately lighter than Porter: it conflates forms of the same word and rarely merges
    different words. A final "e" is dropped so "increase", "increased" and "increases" agree.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    stem = word
    if stem.endswith("ies") and len(stem) > 4:
        stem = stem[:-3] + "y"
    elif stem.endswith("sses"):
        stem = stem[:-2]
    elif stem.endswith("s") and not stem.endswith(("ss", "us", "is")):
        stem = stem[:-1]
    for suffix in ("ing", "ed", "ly"):
        base = stem[: -len(suffix)]
        if stem.endswith(suffix) and len(base) >= 3 and _VOWELS.intersection(base):
            stem = base
            if len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] not in "lsz":
                stem = stem[:-1]
            break
    if stem.endswith("e") and len(stem) > 4:
        stem = stem[:-1]
    return stem


def tokenize(text: str, *, stem: bool = True) -> list[str]:
    """Lowercase unicode words without stopwords, optionally stemmed."""
    words = [word for word in _WORD.findall(text.lower()) if word not in STOPWORDS]
    return [light_stem(word) for word in words] if stem else words


@dataclass(frozen=True)
class Bm25Index:
    """Postings in CSR form: term t's documents are ``doc_index[offsets[t]:offsets[t+1]]``.

    Each posting stores its full BM25 contribution, so a search is one vectorised add per query
    term and a partial sort.
    """

    doc_ids: tuple[str, ...]
    vocabulary: Mapping[str, int]
    offsets: npt.NDArray[np.int64]
    doc_index: npt.NDArray[np.int32]
    weights: npt.NDArray[np.float64]
    k1: float
    b: float
    stem: bool

    @classmethod
    def build(
        cls, docs: Mapping[str, str], *, k1: float = 0.9, b: float = 0.4, stem: bool = True
    ) -> Bm25Index:
        if not docs:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        doc_ids = tuple(docs)
        vocabulary: dict[str, int] = {}
        term_of_posting: list[int] = []
        doc_of_posting: list[int] = []
        tf_of_posting: list[int] = []
        lengths = np.zeros(len(doc_ids), dtype=np.float64)
        for position, doc_id in enumerate(doc_ids):
            tokens = tokenize(docs[doc_id], stem=stem)
            lengths[position] = len(tokens)
            for term, count in Counter(tokens).items():
                term_of_posting.append(vocabulary.setdefault(term, len(vocabulary)))
                doc_of_posting.append(position)
                tf_of_posting.append(count)

        terms = np.asarray(term_of_posting, dtype=np.int64)
        order = np.argsort(terms, kind="stable")
        doc_index = np.asarray(doc_of_posting, dtype=np.int32)[order]
        tf = np.asarray(tf_of_posting, dtype=np.float64)[order]
        doc_freq = np.bincount(terms, minlength=len(vocabulary))
        offsets = np.zeros(len(vocabulary) + 1, dtype=np.int64)
        np.cumsum(doc_freq, out=offsets[1:])

        n_docs = len(doc_ids)
        mean_length = float(lengths.mean()) or 1.0
        idf = np.log1p((n_docs - doc_freq + 0.5) / (doc_freq + 0.5))
        length_norm = k1 * (1.0 - b + b * lengths / mean_length)
        weights = np.repeat(idf, doc_freq) * tf * (k1 + 1.0) / (tf + length_norm[doc_index])
        return cls(doc_ids, vocabulary, offsets, doc_index, weights, k1, b, stem)

    def __len__(self) -> int:
        return len(self.doc_ids)

    def search(self, query: str, top_n: int) -> list[tuple[str, float]]:
        """The best ``top_n`` documents sharing a term with the query, best first.

        Ties go to the document that came first in the corpus, so results are reproducible.
        """
        if top_n <= 0:
            return []
        scores = np.zeros(len(self.doc_ids), dtype=np.float64)
        matched = False
        for term, query_count in Counter(tokenize(query, stem=self.stem)).items():
            term_id = self.vocabulary.get(term)
            if term_id is None:
                continue
            start, end = self.offsets[term_id], self.offsets[term_id + 1]
            # Document indices are unique within one posting list, so fancy-index += is exact.
            scores[self.doc_index[start:end]] += query_count * self.weights[start:end]
            matched = True
        if not matched:
            return []
        candidates = np.flatnonzero(scores)
        if len(candidates) > top_n:
            # Keep every candidate tied with the n-th score so tie-breaking stays by position.
            threshold = np.partition(scores[candidates], len(candidates) - top_n)[-top_n]
            candidates = candidates[scores[candidates] >= threshold]
        ranked = candidates[np.lexsort((candidates, -scores[candidates]))][:top_n]
        return [(self.doc_ids[i], float(scores[i])) for i in ranked]
