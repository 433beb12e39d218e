"""The demo chat corpus: docstring -> code pairs from the Python standard library, mixed with
small prompt-dependent tasks.

The standard library is a real corpus every machine has. A tiny target trained only on it
learns to emit the same generic answer for every prompt, which inflates acceptance lengths;
the synthetic tasks (reverse / sort / upper-case copy / addition) make the target's answer
depend on the prompt, so drafts are measured on something they must actually follow.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

WORDS = (
    "apple river stone cloud green light table paper music north train glass "
    "house bread silver water tiger candle forest window garden yellow orange "
    "planet rocket summer winter spring button pencil mirror castle dragon"
).split()


def iter_stdlib_pairs(
    max_code_chars: int = 700, max_files: int | None = None
) -> Iterator[tuple[str, str]]:
    """Yield ``(instruction, code)`` for documented stdlib functions, in a fixed order.

    The code is ``ast.unparse`` of the function without its docstring, so formatting is
    uniform (4-space indents, normalised quotes) whatever the file's own style.
    """
    for path in stdlib_files()[:max_files]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            summary = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
            node.body = node.body[1:] or [ast.Pass()]
            try:
                code = ast.unparse(node)
            except (ValueError, TypeError, RecursionError):
                continue
            if len(summary) < 12 or len(code) > max_code_chars:
                continue
            yield f"Write a Python function `{node.name}`: {summary}", code


def stdlib_root() -> Path:
    """This interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The standard library's plain modules (no tests, demos or bundled packages), sorted."""
    root = stdlib_root()
    return sorted(p for p in root.rglob("*.py") if _is_plain_module(p.relative_to(root)))


def _is_plain_module(rel: Path) -> bool:
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip"}
    return not (set(rel.parts) & skip)


def make_task(rng: random.Random) -> tuple[str, str]:
    """One prompt-dependent task whose answer a small transformer can learn in minutes."""
    kind = rng.randrange(4)
    if kind == 0:
        words = rng.sample(WORDS, rng.randint(3, 7))
        return "Reverse the words: " + " ".join(words), " ".join(reversed(words))
    if kind == 1:
        nums = [rng.randint(0, 99) for _ in range(rng.randint(3, 8))]
        return "Sort the numbers: " + " ".join(map(str, nums)), " ".join(map(str, sorted(nums)))
    if kind == 2:
        words = rng.sample(WORDS, rng.randint(2, 6))
        text = " ".join(words)
        return "Repeat in upper case: " + text, text.upper()
    a, b = rng.randint(0, 499), rng.randint(0, 499)
    return f"Add: {a} + {b}", f"{a} + {b} = {a + b}"


def build_corpus(
    seed: int, num_tasks: int, max_stdlib_pairs: int, max_files: int | None = None
) -> list[dict]:
    """Deterministic list of chat records ``{"id", "messages"}`` (OpenAI format)."""
    rng = random.Random(seed)
    records = []
    for i, (prompt, code) in enumerate(iter_stdlib_pairs(max_files=max_files)):
        if i >= max_stdlib_pairs:
            break
        records.append(_record(f"stdlib-{i}", [prompt], [code]))
    for i in range(num_tasks):
        turns = [make_task(rng) for _ in range(rng.choice((1, 1, 2)))]
        records.append(_record(f"task-{i}", [t[0] for t in turns], [t[1] for t in turns]))
    rng.shuffle(records)
    return records


def _record(rid: str, prompts: list[str], answers: list[str]) -> dict:
    messages = []
    for prompt, answer in zip(prompts, answers, strict=True):
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    return {"id": rid, "messages": messages}


def split_corpus(records: list[dict], val_fraction: float) -> tuple[list[dict], list[dict]]:
    num_val = max(1, int(len(records) * val_fraction))
    return records[num_val:], records[:num_val]
