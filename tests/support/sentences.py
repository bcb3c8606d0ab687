"""Sentences with a known relevance order, and a long text, for the local judge's encoders."""

from __future__ import annotations

LONG = " ".join(
    f"Section {i}: the retriever returned passage number {i} about photosynthesis, "
    "chlorophyll and light."
    for i in range(40)
)  # 922 tokens: only the first 256 count


SENTENCES = [
    "A man is eating food.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Die Katze schläft auf dem Sofa, während draußen der Regen fällt. Ça va très bien, merci! "
    "Ελληνικά κείμενα. 東京は日本の首都です。 🙂",
    "What is the capital of France?",
    "",
    LONG,
]


# (query, a passage that answers it, a passage about something else)
RELEVANCE_PAIRS = [
    (
        "How do plants make energy from sunlight?",
        "Photosynthesis lets plants turn light, water and carbon dioxide into glucose and oxygen.",
        "The stock market fell sharply after the central bank raised interest rates.",
    ),
    (
        "What is the capital of France?",
        "Paris is the capital and most populous city of France.",
        "Mount Everest is the highest mountain above sea level.",
    ),
    (
        "What are the symptoms of influenza?",
        "Flu usually causes fever, cough, a sore throat, muscle aches and tiredness.",
        "The recipe calls for two cups of flour, a pinch of salt and one egg.",
    ),
    (
        "How do I reset a forgotten password?",
        "To reset your password, choose 'Forgot password' on the sign-in page and follow the link "
        "we email you.",
        "Dolphins use echolocation to find fish in murky water.",
    ),
    (
        "Wie hoch ist der Eiffelturm?",
        "Der Eiffelturm in Paris ist ungefähr 330 Meter hoch.",
        "Der Rhein fließt durch die Schweiz, Deutschland und die Niederlande.",
    ),
]
