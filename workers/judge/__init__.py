"""Judges: the LLM judge through any OpenAI-compatible endpoint, and the local embedding proxy."""

from __future__ import annotations

from service.settings import Settings
from workers.judge.base import Judge

__all__ = ["Judge", "make_judge"]


def make_judge(settings: Settings) -> Judge:
    if settings.uses_local_judge:
        from workers.judge.local import LocalJudge

        return LocalJudge(settings)
    from workers.judge.llm import LlmJudge

    return LlmJudge(settings)
