"""docs/settings.md is generated from the settings class and must not drift from it.

Tests ``service.config.settings``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from scripts import gen_settings_doc
from service.config.settings import Settings
from tests.support.paths import REPO_ROOT


class Example(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EX_")

    token: SecretStr = Field(SecretStr("do-not-print"), description="A secret | with a pipe.")
    ratio: float = Field(0.5, ge=0, lt=1, description="A fraction.")
    mode: Literal["fast", "exact"] = Field("fast", description="How.")
    cuts: tuple[float, float] = Field((0.1, 0.2), description="Two cuts.")
    verbose: bool = Field(False, description="Talk more.")
    name: str = Field("", max_length=20, description="Optional name.")


def rows(text: str) -> list[list[str]]:
    table = [line for line in text.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table]


def test_settings_doc_is_up_to_date() -> None:
    on_disk = (REPO_ROOT / "docs" / "settings.md").read_text()
    assert on_disk == gen_settings_doc.render_settings_doc(Settings), (
        "run: python scripts/gen_settings_doc.py"
    )


def test_every_setting_has_one_row_with_its_variable() -> None:
    table = rows(gen_settings_doc.render_settings_doc(Settings))
    assert [row[0] for row in table] == [f"`RM_{name.upper()}`" for name in Settings.model_fields]
    assert all(row[3] for row in table), "a setting without a description"


def test_rows_show_type_bounds_and_default_but_never_a_secret() -> None:
    text = gen_settings_doc.render_settings_doc(Example)
    assert "do-not-print" not in text
    table = {row[0]: row[1:] for row in rows(text)}
    assert table["`EX_TOKEN`"] == ["string, secret", "*(hidden)*", "A secret \\| with a pipe."]
    assert table["`EX_RATIO`"] == ["number (>= 0, < 1)", "`0.5`", "A fraction."]
    assert table["`EX_MODE`"][:2] == ["one of `fast`, `exact`", "`fast`"]
    assert table["`EX_CUTS`"][:2] == ["JSON array of 2 numbers", "`[0.1, 0.2]`"]
    assert table["`EX_VERBOSE`"][:2] == ["boolean", "`false`"]
    assert table["`EX_NAME`"][:2] == ["string (length <= 20)", "*(empty)*"]


def test_check_mode_fails_on_a_stale_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text("# Settings\n\nold\n")
    monkeypatch.setattr(gen_settings_doc, "DOC_PATH", stale)
    assert gen_settings_doc.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert gen_settings_doc.main([]) == 0
    assert gen_settings_doc.main(["--check"]) == 0
    assert stale.read_text() == gen_settings_doc.render_settings_doc(Settings)
