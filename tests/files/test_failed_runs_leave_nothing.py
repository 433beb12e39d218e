"""Issue 24, "failed runs leave an empty or config-only output directory": a command that
fails after its output would have been created leaves nothing behind: not the directory it
made (nor the parents made with it), not a config.yaml in a directory that was empty. A
directory that existed with something in it, and a run that already logged or saved, are left
as they were. Each test goes through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runs import CONFIG, export_cli, one_line_error, prepare_cli, run_sets, snapshot, train_cli
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train import train as train_module
from eagle_train.cli import prepare_features_app
from eagle_train.config import load_config
from eagle_train.metrics import read_metrics
from eagle_train.run_config import RunConfig
from eagle_train.train import train


def _target(world: Path) -> Path:
    return target_path(world)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("data.train", "not a prepared dataset (no meta.json)"),
        ("data.val", "not a prepared dataset (no meta.json)"),
        ("data.features", "not a feature cache (run prepare-features)"),
        ("draft.init_from", "expected a drafter directory with a config.json"),
    ],
)
def test_a_train_draft_failing_during_setup_leaves_no_directory(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, key: str, why: str
):
    """Before: each of these left ``exp/run/`` (and ``exp/``), empty or holding config.yaml:
    the path was found missing only after the run directory was made."""
    missing = tmp_path / "missing"
    out = tmp_path / "exp" / "run"
    sets = run_sets(_target(tiny_world), tiny_llama_data, out, f"{key}={missing}")
    one_line_error(train_cli(CONFIG, sets), str(missing), why)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # exp/ made for it: gone too


def test_a_failed_train_draft_in_an_empty_directory_leaves_it_empty(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: the user's empty directory kept a config.yaml (and the next run then took it
    for an earlier run). The directory itself, which the user made, stays."""
    out = tmp_path / "run"
    out.mkdir()
    sets = run_sets(_target(tiny_world), tiny_llama_data, out, f"data.val={tmp_path / 'nope'}")
    one_line_error(train_cli(CONFIG, sets), "not a prepared dataset")
    assert out.is_dir() and list(out.iterdir()) == []


def test_a_failure_after_progress_or_in_an_earlier_run_removes_nothing(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, monkeypatch
):
    """The cleanup removes only what a run that did nothing wrote: an earlier run's directory
    (config, metrics, checkpoints) is byte-identical after a resume that fails in setup, and
    a fresh run that fails after logging keeps what it logged."""
    out = tmp_path / "run"
    target = _target(tiny_world)
    assert (
        train_cli(CONFIG, run_sets(target, tiny_llama_data, out, "train.max_steps=2")).exit_code
        == 0
    )
    before = snapshot(out)
    assert any(name.startswith("checkpoints/step-") for name in before)
    again = ["train.max_steps=4", "train.resume=auto", f"data.train={tmp_path / 'x'}"]
    sets = run_sets(target, tiny_llama_data, out, *again)
    one_line_error(train_cli(CONFIG, sets), "not a prepared dataset")
    assert snapshot(out) == before
    late = tmp_path / "late"  # fails at step 3's validation, after steps 1-2 were logged
    sets = run_sets(target, tiny_llama_data, late, "train.log_every=1", "train.val_every=3")
    monkeypatch.setattr(train_module, "validate", _fails)
    with pytest.raises(RuntimeError, match="validation broke"):
        train(load_config(RunConfig, CONFIG, [*sets, f"data.val={tiny_llama_data}"]))
    logged = read_metrics(late / "metrics.jsonl")
    assert [r["step"] for r in logged] == [1, 2, 3] and (
        late / "checkpoints" / "step-0000002"
    ).is_dir()


def _fails(run):
    raise RuntimeError("validation broke")


def test_prepare_features_checks_every_dataset_before_writing(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: a misspelled data.val was found after the whole train split had been
    extracted: the target ran for nothing and ``features/train/`` was left behind."""
    features = tmp_path / "features"
    missing = tmp_path / "no-val"
    sets = run_sets(
        _target(tiny_world), tiny_llama_data, tmp_path / "run",
        f"data.features={features}", f"data.val={missing}",
    )  # fmt: skip
    args = ["-c", str(CONFIG), *(x for s in sets for x in ("--set", s))]
    one_line_error(CliRunner().invoke(prepare_features_app, args), str(missing))
    assert list(tmp_path.iterdir()) == []


def test_export_draft_of_a_bad_checkpoint_leaves_no_output(tmp_path: Path):
    """A checkpoint found unusable (a bad trainer_state.json) leaves no OUT_DIR behind."""
    bad = tmp_path / "step-0000002"
    bad.mkdir()
    (bad / "trainer_state.json").write_text("{}")
    out = tmp_path / "exports" / "drafter"
    one_line_error(export_cli(bad, out), f"{bad}: not a usable checkpoint")
    assert not (tmp_path / "exports").exists()


def test_prepare_data_with_a_bad_last_record_leaves_no_output(tiny_world: Path, tmp_path: Path):
    """A bad record found after the good ones were tokenized leaves no output_dir behind."""
    chats = (tiny_world / "data" / "train.jsonl").read_text().splitlines(keepends=True)[:8]
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(chats) + json.dumps({"messages": 5}) + "\n")
    out = tmp_path / "prepared" / "llama"
    result = prepare_cli(
        f"inputs=[{data}]", f"output_dir={out}", f"tokenizer={_target(tiny_world)}"
    )
    one_line_error(result, f"{data}:9: 'messages' must be a list")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl"]
