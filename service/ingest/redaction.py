"""Masking sensitive text before it is stored, logged or sent to the judge.

Patterns are named built-ins or regular expressions given as ``re:<pattern>``. A match becomes
``[redacted:<name>]``, so a judge still sees that something was there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

BUILT_IN: dict[str, str] = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    # International or North American numbers with separators; bare short digit runs are not
    # phone numbers (they are years, counts, ids) and stay.
    "phone": (
        r"(?<!\w)(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])"
        r"\d{3,4}[\s.-]\d{3,4}(?!\w)"
    ),
    # Secrets shaped like common API keys and bearer tokens.
    "api_key": (
        r"(?:sk|pk|rk|rm)[-_][A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}"
        r"|(?i:bearer)\s+[A-Za-z0-9._~+/-]{20,}=*"
    ),
}


@dataclass(frozen=True)
class Redactor:
    patterns: tuple[tuple[str, re.Pattern[str]], ...]

    @classmethod
    def from_settings(cls, names: Sequence[str]) -> Redactor:
        compiled = []
        for index, name in enumerate(names):
            if name.startswith("re:"):
                compiled.append((f"custom{index}", re.compile(name[3:])))
            elif name in BUILT_IN:
                compiled.append((name, re.compile(BUILT_IN[name])))
            else:
                raise ValueError(
                    f"unknown redaction pattern {name!r}: "
                    f"use one of {sorted(BUILT_IN)} or re:<regex>"
                )
        return cls(tuple(compiled))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def redact(self, text: str) -> str:
        for name, pattern in self.patterns:
            text = pattern.sub(f"[redacted:{name}]", text)
        return text
