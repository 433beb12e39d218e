"""The target's own answers from an ``eval-acceptance`` run as chats, for ``prepare-data`` and
then ``compare_estimates.py``: the drafter's acceptance replayed offline on exactly the tokens
vLLM served (each question's turns with the target-alone answers, both turns in one row).

Usage:
  python research/eval_to_chats.py EVAL_DIR QUESTIONS TOKENIZER OUT.jsonl

EVAL_DIR holds ``per_prompt.jsonl`` (its ``target`` records: interleave=false or a run with
the target alone), QUESTIONS the prompts the run read (``mt_bench`` or a JSONL file, parsed by
eval-acceptance's own ``load_prompts``, so ids and a system message are the served ones). A
question's turns stop at the first one the run did not answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from eagle_train.evaluate.prompts import PromptError, load_prompts
from eagle_train.fsutil import atomic_write_bytes

USAGE = "usage: python research/eval_to_chats.py EVAL_DIR QUESTIONS TOKENIZER OUT.jsonl"


def main() -> int:
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if len(sys.argv) != 5:
        print(USAGE, file=sys.stderr)
        return 2
    eval_dir, questions, tokenizer, out = (Path(a) for a in sys.argv[1:])
    records = eval_dir / "per_prompt.jsonl"
    if not records.is_file():
        print(f"{records}: expected an eval-acceptance run's records", file=sys.stderr)
        return 2
    try:
        prompts = load_prompts(questions)
    except PromptError as exc:
        print(exc, file=sys.stderr)
        return 2
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    answers = {}
    for line in records.read_text().splitlines():
        r = json.loads(line)
        if r["model"] == "target":
            answers[(str(r["id"]), r["turn"])] = tok.decode(r["output"])
    rows = []
    for prompt in prompts:
        messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
        for turn, text in enumerate(prompt.turns, start=1):
            if (prompt.id, turn) not in answers:
                break
            messages += [
                {"role": "user", "content": text},
                {"role": "assistant", "content": answers[(prompt.id, turn)]},
            ]
        if any(m["role"] == "assistant" for m in messages):
            rows.append({"id": prompt.id, "category": prompt.category, "messages": messages})
    atomic_write_bytes(out, "".join(json.dumps(r) + "\n" for r in rows).encode())
    answered = sum(m["role"] == "assistant" for r in rows for m in r["messages"])
    print(f"{out}: {len(rows)} chats, {answered} answers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
