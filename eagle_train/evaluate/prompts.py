"""Evaluation prompts: the built-in MT-Bench questions, or any JSONL of prompts/messages.

MT-Bench (80 questions, 8 categories, two turns each; lm-sys/FastChat, Apache-2.0, license
beside the data file) ships inside the package so the harness works offline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from eagle_train.errors import UserError

MT_BENCH = "mt_bench"


class PromptError(UserError, ValueError):
    """A prompts file that is missing, not UTF-8, or holds a malformed line."""


@dataclass(frozen=True)
class EvalPrompt:
    id: str
    category: str
    turns: tuple[str, ...]  # user messages, in order
    system: str | None = None


def load_prompts(source: str | Path = MT_BENCH, limit: int | None = None) -> list[EvalPrompt]:
    """``"mt_bench"`` or a JSONL file whose lines have ``turns`` (list of user messages),
    ``prompt`` (one string) or ``messages`` (OpenAI format; the user turns are taken, a
    leading system message kept); optional ``id``/``question_id`` and ``category``."""
    if str(source) == MT_BENCH:
        text = (
            resources.files("eagle_train.evaluate")
            .joinpath("data/mt_bench/question.jsonl")
            .read_text()
        )
        name = "mt_bench/question.jsonl"
    else:
        path = Path(source)
        if not path.is_file():
            raise PromptError(f"{path}: prompt file not found")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise PromptError(
                f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8"
            ) from None
        name = str(path)
    prompts = [_parse(line, name, n) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not prompts:
        raise PromptError(f"{name}: no prompts")
    return prompts[:limit]


def _parse(line: str, name: str, n: int) -> EvalPrompt:
    where = f"{name}:{n}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptError(f"{where}: malformed JSON: {exc.msg}") from None
    if not isinstance(row, dict):
        raise PromptError(f"{where}: expected a JSON object")
    system = None
    if "turns" in row:
        turns = row["turns"]
    elif "prompt" in row:
        turns = [row["prompt"]]
    elif "messages" in row:
        msgs = row["messages"]
        if msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
            system = msgs[0].get("content")
        turns = [m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
    else:
        raise PromptError(f"{where}: expected one of the keys 'turns', 'prompt', 'messages'")
    if not turns or not all(isinstance(t, str) and t for t in turns):
        raise PromptError(f"{where}: needs at least one non-empty user turn (strings)")
    pid = str(row.get("question_id", row.get("id", n)))
    return EvalPrompt(
        id=pid, category=str(row.get("category", "all")), turns=tuple(turns), system=system
    )
