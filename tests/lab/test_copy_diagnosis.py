"""research/copy_diagnosis.py: the copy rule's counts on hand-traced sequences; it and
compare_estimates.py on a drafter trained on a mixture of two datasets (whose draft vocabulary
is the checkpoint's own: compare_estimates once failed on a mixture's list of paths);
copy_trace.py on a second turn that repeats the first answer (every token has a match)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, draft_vocab_sets, prepare_tiny_data
from transformers import AutoTokenizer
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app

RESEARCH = Path(__file__).resolve().parents[2] / "research"
sys.path.insert(0, str(RESEARCH))  # the tools import each other as plain modules

from copy_diagnosis import copy_rule_counts  # noqa: E402


def test_copy_rule_counts_on_a_hand_traced_sequence() -> None:
    # slot t proposes token t+2; the rule: what followed the last earlier (x_t, x_{t+1})
    ids = [5, 6, 7, 5, 6, 7, 5, 6, 9]
    mask = [0, 0, 0, 1, 1, 1, 1, 1, 1]
    first = [0, 5, 0, 7, 1, 6, 9, 0, 0]  # right at t = 1, 3, 5, 6
    # rule: t=3 (5,6)->7 right, t=4 (6,7)->5 right, t=5 (7,5)->6 right, t=6 (5,6)->7 wrong
    assert copy_rule_counts(ids, mask, first) == {
        "slots": 6,
        "drafter": 4,
        "rule_applies": 4,
        "rule": 3,
        "drafter_there": 3,
        "rule_only": 1,  # t=4
    }


def test_a_run_of_one_token_is_known_at_its_third_repeat() -> None:
    # at slot 2 the pair (2, 2) was followed by 2 (tokens 2..3): the rule proposes 2
    counts = copy_rule_counts([1, 2, 2, 2, 2], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0])
    assert (counts["slots"], counts["rule_applies"], counts["rule"]) == (3, 1, 1)
    assert counts["rule_only"] == 1


def test_the_diagnoses_run_on_a_drafter_trained_on_a_mixture(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
) -> None:
    small = prepare_tiny_data(tiny_world, "llama", "val", tmp_path / "val", regenerate=False)
    target = tiny_world / "targets" / "llama" / "bf16"
    out = tmp_path / "run"
    args = ["--config", str(REPO / "configs" / "train" / "eagle3-llama-demo.yaml")]
    for o in [
        f"target.path={target}",
        f"data.train=[{{path: {tiny_llama_data}, weight: 3}}, {{path: {small}, weight: 1}}]",
        "data.val=null",
        "data.max_length=128",
        f"train.output_dir={out}",
        "train.max_steps=2",
        "train.save_every=2",
        "train.progress=false",
        *draft_vocab_sets("eagle3"),
    ]:
        args += ["--set", o]
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 0, result.output
    checkpoint = out / "checkpoints" / "step-0000002"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    for script, extra in [
        ("copy_diagnosis.py", ["--rows", "3", "--spans", "2", "--span-length", "8"]),
        ("compare_estimates.py", ["--rows", "3"]),
    ]:
        report = tmp_path / f"{script}.json"
        run = subprocess.run(
            [sys.executable, f"research/{script}", checkpoint, small, "--out", report, *extra],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert json.loads(report.read_text())["checkpoint"] == str(checkpoint)
    copy = json.loads((tmp_path / "copy_diagnosis.py.json").read_text())
    assert copy["rows"] == 3 and copy["spans"]["slots"] == 2 * (2 * 8 - 2)
    assert list(copy["ablation"]) == ["none", "1", "2", "3"]  # the demo config's aux layers
    assert len(copy["readout"]) == 3  # the demo config's ttt_steps
    for r in copy["readout"]:
        assert 0 < r["slots"] and r["right_on_match"] <= r["on_match"] <= r["matched"] <= r["slots"]
    # copy_trace: turn 2 repeats the turn-1 answer, which its context holds, so every answer
    # token but the first continues a pair written before: all of them match
    answer = AutoTokenizer.from_pretrained(target)(
        "the cat sat on the mat", add_special_tokens=False
    )
    answer = answer["input_ids"]
    evaluated = tmp_path / "eval"
    evaluated.mkdir()
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question_id": 7, "turns": ["Say it.", "Again."]}) + "\n")
    (evaluated / "per_prompt.jsonl").write_text(
        "".join(
            json.dumps({"model": "target", "id": "7", "turn": turn, "output": answer}) + "\n"
            for turn in (1, 2)
        )
    )
    trace = subprocess.run(
        [sys.executable, "research/copy_trace.py", checkpoint, evaluated, questions, "7"]
        + ["--turn", "2", "--target", target],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert trace.returncode == 0, trace.stderr[-3000:]
    last = trace.stdout.strip().splitlines()[-1]
    tokens, in_vocab, matched = (int(w) for w in re.findall(r"\d+", last)[:3])
    assert tokens == len(answer) - 1 and 0 < in_vocab == matched <= tokens, last
    missing = subprocess.run(
        [sys.executable, "research/copy_diagnosis.py", tmp_path / "nope", small, "--out", report],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "nope: does not exist" in missing.stderr
