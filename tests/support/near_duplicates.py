"""The near-duplicate count written the plain way, as the reference the signals are checked
against, and hypothesis passages to feed it."""

from __future__ import annotations

import re

from hypothesis import strategies as st

# Few words, so passages often repeat or nearly repeat each other; one non-ASCII word and
# punctuation exercise the regex path and the word boundaries.
_WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "Epsilon", "zeta", "café", "x_1"])
_SEPARATORS = st.sampled_from([" ", ", ", ". ", "\n", " - ", "'"])


def reference_near_duplicates(texts: list[str], threshold: float) -> int:
    """The definition itself: every pair, the regex's words, no filter and no cache."""
    sets = []
    for text in texts:
        found = re.findall(r"\w+", text.lower())[:200]
        grams = {tuple(found[i : i + 3]) for i in range(len(found) - 2)}
        sets.append(grams if len(found) >= 3 else ({tuple(found)} if found else set()))
    count = 0
    for i, current in enumerate(sets):
        for earlier in sets[:i]:
            union = len(current | earlier)
            if (len(current & earlier) / union if union else 1.0) >= threshold:
                count += 1
                break
    return count


@st.composite
def near_duplicate_passages(draw: st.DrawFn) -> list[str]:
    base = draw(st.lists(st.tuples(_WORDS, _SEPARATORS), min_size=0, max_size=40))
    texts = []
    for _ in range(draw(st.integers(1, 8))):
        edited = list(base)
        for _ in range(draw(st.integers(0, 4))):  # a few substitutions, cuts or appends
            edit = draw(st.integers(0, 2))
            position = draw(st.integers(0, len(edited)))
            if edit == 0 and position < len(edited):
                edited[position] = draw(st.tuples(_WORDS, _SEPARATORS))
            elif edit == 1:
                edited = edited[:position]
            else:
                edited.append(draw(st.tuples(_WORDS, _SEPARATORS)))
        texts.append("".join(w + sep for w, sep in edited))
    return texts
