"""Task stems that open synthesized user turns (``synthesize.stems: builtin``).

Unseeded, a small target writes the same few kinds of user turn over and over (greetings,
short factual questions). Each request starting with a stem (the target writes the rest)
spreads the prompts over the task types chat benchmarks ask for: writing, roleplay,
reasoning, math, coding, extraction, science and the humanities.
"""

from __future__ import annotations

from pathlib import Path

from eagle_train.data.errors import DataError

BUILTIN = (
    # writing
    "Write a short story about",
    "Write a poem about",
    "Write an email to",
    "Write a blog post about",
    "Compose a persuasive essay on",
    "Draft a speech for",
    # roleplay
    "Imagine you are",
    "Pretend to be",
    "Act as a",
    # reasoning
    "If all",
    "Solve this riddle:",
    "Which is heavier,",
    # math
    "Calculate",
    "Solve for x:",
    "What is the probability that",
    "A train leaves",
    # coding
    "Write a Python function that",
    "How do I implement",
    "Fix the bug in this code:",
    "Write a SQL query that",
    "Explain what this code does:",
    # extraction
    "Extract the names and dates from the following text:",
    "From the text below, list",
    "Summarize the following paragraph:",
    # science
    "Explain how",
    "What causes",
    "Why does",
    "Describe the process of",
    # humanities and everyday
    "What were the main causes of",
    "Compare and contrast",
    "Discuss the impact of",
    "Give me three tips for",
    "What is the difference between",
    "Can you help me plan",
    "Rewrite the following sentence",
    "Suggest a name for",
)


def load_stems(source: str | Path | None) -> tuple[str, ...]:
    """The stems ``synthesize.stems`` names (empty for None)."""
    if source is None:
        return ()
    if source == "builtin":
        return BUILTIN
    path = Path(source)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"synthesize.stems: {path}: unreadable ({exc})", reason="config") from None
    stems = tuple(line.strip() for line in lines if line.strip())
    if not stems:
        raise DataError(f"synthesize.stems: {path}: expected one stem per line, found none",
                        reason="config")  # fmt: skip
    return stems
