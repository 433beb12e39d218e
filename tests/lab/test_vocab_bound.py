"""research/vocab_bound.py: the draft-vocabulary bound on tokens per target step, worked by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]

RESEARCH = Path(__file__).resolve().parents[2] / "research"
sys.path.insert(0, str(RESEARCH))  # the tools import each other as plain modules

from vocab_bound import bound_steps  # noqa: E402


def test_bound_steps_by_hand():
    every = [True] * 10
    assert bound_steps([1, 2, 3, 4, 5, 6, 7], every, 3) == 2  # 3 + bonus, 3 (end)
    assert bound_steps([1, 2, 3, 4, 5, 6, 7], [False] * 10, 3) == 7  # one token per step
    some = [t in (5, 6, 8, 9) for t in range(10)]
    assert bound_steps([5, 6, 7, 8, 9], some, 3) == 2  # 5 6 + bonus 7, then 8 9 (end)
    assert bound_steps([5, 6, 7, 8, 9], some, 1) == 3  # 5 + 6, 7 + 8, 9


def test_the_table_on_a_tiny_eval(tmp_path):
    rows = [
        {"model": "target", "id": "1", "turn": 1, "output": [3, 5, 6, 7, 8, 9]},
        # (6 - 1) / max(6 - 1 - 4, 1) = 5.0 tokens per step: above the bound of 2.5
        {"model": "eagle", "id": "1", "turn": 1, "new_tokens": 6, "accepted": 4, "drafts": 1},
        # (6 - 1) / max(6 - 1 - 3, 2) = 2.5: equal, not above
        {"model": "ngram", "id": "1", "turn": 1, "new_tokens": 6, "accepted": 3, "drafts": 2},
    ]
    (tmp_path / "per_prompt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = torch.zeros(12, dtype=torch.int64)
    counts[[5, 6, 8, 9]] = torch.tensor([10, 9, 8, 7])  # the top 4; 7 is never supervised
    save_file({"counts": counts}, str(tmp_path / "counts.safetensors"))
    out = subprocess.run(
        [
            sys.executable,
            "research/vocab_bound.py",
            str(tmp_path),
            str(tmp_path / "counts.safetensors"),
            "--sizes",
            "4",
            "--k",
            "3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "1 requests, 5 answer tokens, K=3" in out
    # coverage 4/5; no 3-token window is wholly in {5, 6, 8, 9}; 5 tokens in 2 steps
    assert "| top 4 | 0.800 | 0.000 | 2.500 | 2.500 | 1 | 0 |" in out
