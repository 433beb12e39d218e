"""Shipped lists that shape synthesized conversations.

- Task stems open synthesized user turns (``synthesize.stems: builtin``). Unseeded, a small
  target writes the same few kinds of user turn over and over (greetings, short factual
  questions). Each request starting with a stem (the target writes the rest) spreads the
  prompts over the task types chat benchmarks ask for: writing, roleplay, reasoning, math,
  coding, extraction, science and the humanities.
- Follow-up requests make a synthesized conversation two user turns long
  (``synthesize.follow_ups: builtin``). A second turn that asks to rework the first answer
  (shorten it, rewrite it for someone else, list it) is where a chat's text repeats its own
  context, which a drafter trained on single turns never sees. They are written here, not
  taken from any benchmark.
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


FOLLOW_UPS = (
    "Can you make your answer shorter?",
    "Rewrite your previous answer in a more formal tone.",
    "Rewrite your answer so that a ten-year-old could understand it.",
    "Summarize your answer in two sentences.",
    "Turn your answer into a bulleted list.",
    "Expand on the most important point in your answer.",
    "Give an example that illustrates your answer.",
    "Rewrite your answer as a short poem.",
    "What are the weaknesses of your answer? Then improve it.",
    "Translate the first sentence of your answer into French.",
    "Repeat your answer, but add a title at the top.",
    "Now write the same thing from the opposite point of view.",
    "Rewrite your answer in the style of a news report.",
    "Add a concluding paragraph to your answer.",
    "Can you explain the second part of your answer in more detail?",
    "Rewrite your previous response in the first person.",
    "Make your answer more persuasive.",
    "Give your answer again as a numbered list of steps.",
    "Rewrite your answer as a dialogue between two people.",
    "Now shorten it to a message of under 280 characters.",
    "Rewrite your answer to be more concise and remove any repetition.",
    "What would change in your answer if the situation were reversed?",
    "Correct any mistakes in your previous answer and give the final version.",
    "Rewrite your answer in a friendly, casual tone.",
    "Put the main points of your answer in a table.",
    "Write your answer again, but start each paragraph with a question.",
    "Give me three follow-up questions I could ask about this.",
    "Now write a short email that summarizes your answer.",
    "Rewrite the answer for an expert audience.",
    "Can you give a different answer to my question?",
    "Check your answer step by step and rewrite it if needed.",
    "Keep the same content, but use simpler words.",
)


def load_stems(source: str | Path | None) -> tuple[str, ...]:
    """The stems ``synthesize.stems`` names (empty for None)."""
    return load_lines(source, BUILTIN, "synthesize.stems", "stem")


def load_follow_ups(source: str | Path | None) -> tuple[str, ...]:
    """The follow-up requests ``synthesize.follow_ups`` names (empty for None)."""
    return load_lines(source, FOLLOW_UPS, "synthesize.follow_ups", "follow-up request")


def load_lines(
    source: str | Path | None, builtin: tuple[str, ...], key: str, what: str
) -> tuple[str, ...]:
    """None -> (), "builtin" -> the shipped list, a path -> its non-empty lines."""
    if source is None:
        return ()
    if source == "builtin":
        return builtin
    path = Path(source)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{key}: {path}: unreadable ({exc})", reason="config") from None
    items = tuple(line.strip() for line in lines if line.strip())
    if not items:
        raise DataError(f"{key}: {path}: expected one {what} per line, found none",
                        reason="config")  # fmt: skip
    return items
