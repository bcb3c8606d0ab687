"""Judges: the LLM judge through any OpenAI-compatible endpoint, and the local embedding proxy.

May import: ``service.primitives``, ``service.config``, ``service.store`` and ``service.measures``.
"""

from __future__ import annotations

from redis import Redis

from service.config.settings import Settings
from workers.judge.base import Judge

__all__ = ["Judge", "make_judge"]


def make_judge(settings: Settings, redis: Redis | None = None) -> Judge:
    """The judge the settings ask for; ``redis`` shares what the LLM judge learns of its server,
    and the local judge's passage vectors.

    Without ``redis`` the LLM judge connects to ``settings.redis_url`` itself when one is set;
    the local judge then keeps no vectors beyond a slice.
    """
    if settings.uses_local_judge:
        from workers.judge.local import LocalJudge

        return LocalJudge(settings, redis)
    from workers.judge.llm import LlmJudge

    return LlmJudge(settings, redis)
