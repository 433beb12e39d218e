"""research/eval_to_chats.py: an eval run's target-alone answers become the chats the offline
replay reads, each turn's answer after its own question (the tokens decoded by the tokenizer
itself), drafters' records ignored, a turn the run did not answer left out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from transformers import AutoTokenizer


def test_each_answer_follows_its_own_question(tiny_world: Path, tmp_path: Path) -> None:
    tokenizer = tiny_world / "targets" / "llama" / "fp32"
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    texts = {("7", 1): "the first answer", ("7", 2): "a second one", ("9", 1): "only one turn"}
    records = [
        {"model": "target", "id": qid, "turn": turn, "output": tok.encode(text)}
        for (qid, turn), text in texts.items()
    ] + [{"model": "ngram", "id": "7", "turn": 1, "output": tok.encode("not the target")}]
    run = tmp_path / "eval"
    run.mkdir()
    (run / "per_prompt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        json.dumps({"question_id": 9, "category": "math", "turns": ["Q9a", "Q9b"]})
        + "\n"
        + json.dumps({"question_id": 7, "category": "writing", "turns": ["Q7a", "Q7b"]})
        + "\n"
    )
    out = tmp_path / "chats.jsonl"
    subprocess.run(
        [sys.executable, "research/eval_to_chats.py", run, questions, tokenizer, out],
        cwd=REPO,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    chats = [json.loads(line) for line in out.read_text().splitlines()]
    assert [c["id"] for c in chats] == ["9", "7"]
    assert [(m["role"], m["content"]) for m in chats[0]["messages"]] == [
        ("user", "Q9a"),
        ("assistant", tok.decode(tok.encode("only one turn"))),
    ]
    assert [m["content"] for m in chats[1]["messages"]] == [
        "Q7a",
        tok.decode(tok.encode("the first answer")),
        "Q7b",
        tok.decode(tok.encode("a second one")),
    ]
