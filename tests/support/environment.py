"""Where the tests' Redis and PostgreSQL are, and the settings and environment a test hands
to the app or to a process it starts."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from service.config.settings import Settings
from tests.support.paths import REPO_ROOT

REDIS_URL = os.environ.get("RM_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


POSTGRES_ADMIN_URL = os.environ.get(
    "RM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def make_settings(tmp_path: Path, database_url: str, redis_url: str, **extra: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "redis_url": redis_url,
        "data_dir": str(tmp_path / "var"),
        "queue_name": f"judge-test-{uuid.uuid4().hex[:8]}",
        "log_json": False,
    }
    values.update(extra)
    return Settings.model_validate(values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes another process see these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    for name, value in settings.model_dump(mode="json").items():
        if isinstance(value, list | tuple | dict):
            import json

            env[f"RM_{name.upper()}"] = json.dumps(value)
        elif value is not None:
            env[f"RM_{name.upper()}"] = str(value)
    env["RM_JUDGE_API_KEY"] = settings.judge_api_key.get_secret_value()
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")
