"""export-draft RUN_DIR OUT: the run's best/ where the acceptance probe kept one, else its
newest intact checkpoint; a checkpoint directory is still exported as it is. The run is a
real tiny training run with a checkpoint at every step; best/ holds a copy of one of them,
as the probe's save would (the probe itself needs a vLLM engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from run_configs import run_config
from typer.testing import CliRunner

from eagle_train.checkpoint import STATE_FILE
from eagle_train.cli import export_draft_app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tiny_world: Path, tiny_llama_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with checkpoints at steps 1, 2 and 3 (no best/)."""
    from eagle_train.train import train

    out = tmp_path_factory.mktemp("export-choice") / "run"
    cfg = run_config(
        tiny_world,
        tiny_llama_data,
        out,
        "data.micro_batch_size=2",
        "data.max_length=64",
        "train.max_steps=3",
        "train.save_every=1",
        "train.keep_last=3",
    )
    train(cfg)
    return out


def export(source: Path, out: Path) -> tuple[str, int]:
    """export-draft SOURCE OUT: (its output, the step of the checkpoint it exported)."""
    result = CliRunner().invoke(export_draft_app, [str(source), str(out)])
    assert result.exit_code == 0, result.output
    return result.output, json.loads((out / "eagle_train.json").read_text())["step"]


def copy_run(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def test_a_run_with_best_exports_best(run: Path, tmp_path: Path) -> None:
    run = copy_run(run, tmp_path)
    steps = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert steps == ["step-0000001", "step-0000002", "step-0000003"]
    shutil.copytree(run / "checkpoints" / "step-0000002", run / "best" / "step-0000002")
    output, step = export(run, run / "drafter")
    assert step == 2  # best/, not the newest checkpoint (3)
    assert f"exporting {run / 'best' / 'step-0000002'}" in output and "best" in output


def test_without_best_the_newest_intact_checkpoint(run: Path, tmp_path: Path) -> None:
    run = copy_run(run, tmp_path)
    ckpts = run / "checkpoints"
    cut = shutil.copytree(ckpts / "step-0000003", ckpts / "step-0000004")
    (cut / STATE_FILE).unlink()  # a writer killed before its last file
    corrupt = shutil.copytree(ckpts / "step-0000003", ckpts / "step-0000005")
    with open(corrupt / "draft.safetensors", "r+b") as f:  # truncated
        f.truncate(100)
    output, step = export(run, tmp_path / "drafter")
    assert step == 3
    assert f"exporting {ckpts / 'step-0000003'}" in output and "newest intact" in output


def test_an_empty_best_falls_back_to_the_newest(run: Path, tmp_path: Path) -> None:
    run = copy_run(run, tmp_path)
    (run / "best").mkdir()
    _, step = export(run, tmp_path / "drafter")
    assert step == 3


def test_a_checkpoint_directory_is_exported_as_given(run: Path, tmp_path: Path) -> None:
    ckpt = run / "checkpoints" / "step-0000001"
    output, step = export(ckpt, tmp_path / "drafter")
    assert step == 1 and f"exporting {ckpt}: the checkpoint given" in output


def test_a_run_without_an_intact_checkpoint_is_one_line(run: Path, tmp_path: Path) -> None:
    broken = tmp_path / "run"
    shutil.copytree(run / "checkpoints" / "step-0000001", broken / "checkpoints" / "step-0000001")
    (broken / "checkpoints" / "step-0000001" / STATE_FILE).unlink()
    result = CliRunner().invoke(export_draft_app, [str(broken), str(tmp_path / "drafter")])
    assert result.exit_code == 2
    assert f"{broken}: a run directory without an intact checkpoint" in result.output
    assert not (tmp_path / "drafter").exists()
