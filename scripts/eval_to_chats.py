"""The target's own answers from an ``eval-acceptance`` run as chats, for ``prepare-data`` and
then ``compare_estimates.py``: the drafter's acceptance replayed offline on exactly the tokens
vLLM served (each question's turns with the target-alone answers, both turns in one row).

Usage:
  python scripts/eval_to_chats.py EVAL_DIR QUESTIONS TOKENIZER OUT.jsonl

EVAL_DIR holds ``per_prompt.jsonl`` (its ``target`` records: interleave=false or a run with
the target alone), QUESTIONS the MT-Bench-style JSONL the run read (``question_id``,
``category``, ``turns``). A question with a turn the run did not answer is left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from eagle_train.fsutil import atomic_write_bytes


def main() -> int:
    if len(sys.argv) != 5:
        print(
            "usage: python scripts/eval_to_chats.py EVAL_DIR QUESTIONS TOKENIZER OUT.jsonl",
            file=sys.stderr,
        )
        return 2
    eval_dir, questions, tokenizer, out = (Path(a) for a in sys.argv[1:])
    records = eval_dir / "per_prompt.jsonl"
    for path in (records, questions):
        if not path.is_file():
            print(f"{path}: expected a file", file=sys.stderr)
            return 2
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    answers = {}
    for line in records.read_text().splitlines():
        r = json.loads(line)
        if r["model"] == "target":
            answers[(str(r["id"]), r["turn"])] = tok.decode(r["output"])
    rows = []
    for line in questions.read_text().splitlines():
        q = json.loads(line)
        qid, messages = str(q["question_id"]), []
        for turn, text in enumerate(q["turns"], start=1):
            if (qid, turn) not in answers:
                break
            messages += [
                {"role": "user", "content": text},
                {"role": "assistant", "content": answers[(qid, turn)]},
            ]
        if messages:
            rows.append({"id": qid, "category": q.get("category"), "messages": messages})
    atomic_write_bytes(out, "".join(json.dumps(r) + "\n" for r in rows).encode())
    print(f"{out}: {len(rows)} chats, {sum(len(r['messages']) // 2 for r in rows)} answers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
