"""eval-acceptance names a damaged drafter and never writes over an earlier evaluation (issue 18)."""

from __future__ import annotations

import json
from pathlib import Path

from run_configs import target_path
from typer.testing import CliRunner


def evaluate(target: Path, drafter: Path, out: Path, *extra: str):
    from eagle_train.cli import eval_acceptance_app

    args = ["--target", str(target), "--draft", str(drafter), "--out", str(out), *extra]
    return CliRunner().invoke(eval_acceptance_app, args)


def test_eval_names_a_truncated_drafter(tiny_world: Path, tmp_path: Path, no_vllm: None):
    """Before: a SafetensorError traceback."""
    from exported_drafts import export_random

    drafter = export_random(tiny_world, "llama", tmp_path / "d")
    weights = drafter / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = evaluate(target_path(tiny_world), drafter, tmp_path / "eval")
    assert result.exit_code == 2, result.output
    assert f"{weights}: not a readable safetensors file" in result.output
    assert not (tmp_path / "eval").exists()


def test_eval_out_onto_an_earlier_evaluation(tiny_world: Path, tmp_path: Path, no_vllm: None):
    """Before: --out wrote into any directory, over an earlier evaluation's files."""
    from exported_drafts import export_random

    target = target_path(tiny_world)
    drafter = export_random(tiny_world, "llama", tmp_path / "d")
    earlier = tmp_path / "eval"
    earlier.mkdir()
    (earlier / "summary.json").write_text(json.dumps({"drafters": {}, "baseline_tokens_per_s": 1}))
    (earlier / "per_prompt.jsonl").write_text("{}\n")
    user = tmp_path / "mine"
    user.mkdir()
    (user / "summary.json").write_text("my own summary")
    for out, extra, why in [
        (earlier, (), "already exists; pass --overwrite to replace it"),
        (user, ("--overwrite",), "holds summary.json (and no record of the files"),
        (drafter, ("--overwrite",), "is the drafter"),
        (drafter / "eval", ("--overwrite",), "is inside the drafter"),
    ]:
        result = evaluate(target, drafter, out, *extra)
        assert result.exit_code == 2, result.output
        assert why in result.output
    assert (user / "summary.json").read_text() == "my own summary"
    # An earlier evaluation with --overwrite passes the checks (and reaches the engine).
    result = evaluate(target, drafter, earlier, "--overwrite")
    assert isinstance(result.exception, AssertionError), result.output
    assert (earlier / "per_prompt.jsonl").read_text() == "{}\n"
