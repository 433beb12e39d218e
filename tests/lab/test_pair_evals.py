"""research/pair_evals.py: two runs' proposers paired per request and per turn, against
tokens per target step counted by hand; bad input is one line and exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

RESEARCH = Path(__file__).resolve().parents[2] / "research"
sys.path.insert(0, str(RESEARCH))  # the tools import each other as plain modules

from pair_evals import main  # noqa: E402


def rec(model: str, pid: str, turn: int, new_tokens: int, accepted: int, output=None) -> dict:
    # tokens per target step = (new_tokens - 1) / (new_tokens - 1 - accepted)
    return {
        "model": model,
        "id": pid,
        "turn": turn,
        "new_tokens": new_tokens,
        "drafts": 1,  # drafted on some steps: the count does not enter here
        "accepted": accepted,
        "output": output or [0] * new_tokens,
    }


def write(path: Path, records: list[dict]) -> Path:
    path.mkdir()
    (path / "per_prompt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_pairs_across_runs_per_turn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # A's n-gram: 21/11 -> 20/10 = 2.0, 25/13 -> 24/12 = 2.0, 21/11 -> 2.0, 25/13 -> 2.0
    a = write(
        tmp_path / "a",
        [
            rec("target", "p1", 1, 21, 0),
            rec("ngram", "p1", 1, 21, 10),
            rec("ngram", "p2", 1, 25, 12),
            rec("ngram", "p1", 2, 21, 10),
            rec("ngram", "p2", 2, 25, 12),
        ],
    )
    # B's drafter: 2.2 (22/10), 2.4 (24/10), 2.0 (20/10), 1.5 (18/12); the outputs (zeros, one
    # per token) differ where the lengths do: p1 turn 1 and p2 turn 2
    b = write(
        tmp_path / "b",
        [
            rec("runs/d", "p1", 1, 23, 12),
            rec("runs/d", "p2", 1, 25, 14),
            rec("runs/d", "p1", 2, 21, 10),
            rec("runs/d", "p2", 2, 19, 6),
        ],
    )
    assert main([str(a), "ngram", str(b), "runs/d"]) == 0
    out = capsys.readouterr().out
    # differences +0.2, +0.4, 0.0, -0.5; pooled B overall (22+24+20+18) / (10+10+10+12) = 2.0
    assert "| all | 4 | 2.000 | 2.000 | +0.025 [" in out and "| 2 / 1 | 2 |" in out
    assert "| turn 1 | 2 | 2.000 | 2.300 | +0.300 [" in out and "| 2 / 0 | 1 |" in out
    # turn 2: pooled B (20 + 18) / (10 + 12)
    assert f"| turn 2 | 2 | 2.000 | {38 / 22:.3f} | -0.250 [" in out and "| 0 / 1 | 1 |" in out


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = write(tmp_path / "a", [rec("ngram", "p1", 1, 21, 10), rec("ngram", "p2", 1, 21, 10)])
    b = write(tmp_path / "b", [rec("runs/d", "p1", 1, 21, 10)])
    assert main([str(a), "eagle", str(b), "runs/d"]) == 2
    assert capsys.readouterr().err == f"{a}: no records of model 'eagle' (it has ['ngram'])\n"
    assert main([str(a), "ngram", str(b), "runs/d"]) == 2
    err = capsys.readouterr().err
    assert err == "the runs served different requests: 1 only in A, 0 only in B\n"
    assert main([str(tmp_path / "nope"), "ngram", str(b), "runs/d"]) == 2
    assert "nope: no per_prompt.jsonl" in capsys.readouterr().err
