"""train-draft refuses inputs it cannot train from before it writes anything: a missing target or one without config.json, a truncated prepared dataset, fewer rows than one batch (issue 18)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runs import cli_args, run_sets
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app


def test_a_missing_target_or_one_without_config_json(tiny_llama_data: Path, tmp_path: Path):
    """Before: 216 lines of traceback ending in "couldn't connect to huggingface.co"."""
    no_config = tmp_path / "model"
    no_config.mkdir()
    for target, why in [
        (tmp_path / "nowhere" / "model", "no such directory"),
        (no_config, "no config.json in this directory"),
    ]:
        sets = run_sets(target, tiny_llama_data, tmp_path / "run")
        result = CliRunner().invoke(train_draft_app, cli_args(sets))
        assert result.exit_code == 2, result.output
        assert f"target.path '{target}': {why}" in result.output
        assert "Traceback" not in result.output


def damaged_data(source: Path, tmp_path: Path, name: str) -> Path:
    data = tmp_path / "data"
    shutil.copytree(source, data)
    victim = next(data.glob(name))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    return victim


@pytest.mark.parametrize("name", ["*.arrow", "token_counts.safetensors"])
def test_a_truncated_prepared_dataset_is_named(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, name: str
):
    """Before: a pyarrow / safetensors traceback."""
    victim = damaged_data(tiny_llama_data, tmp_path, name)
    target = target_path(tiny_world)
    sets = run_sets(target, victim.parent, tmp_path / "run")
    result = CliRunner().invoke(train_draft_app, cli_args(sets))
    assert result.exit_code == 2, result.output
    assert str(victim) in result.output and "truncated" in result.output


def test_fewer_rows_than_one_batch(tiny_world: Path, tiny_llama_data: Path, tmp_path: Path):
    """Before: a ValueError traceback from the loader."""
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, tmp_path / "run", "data.micro_batch_size=100000")
    result = CliRunner().invoke(train_draft_app, cli_args(sets))
    assert result.exit_code == 2, result.output
    assert "rows cannot fill one step" in result.output and "Traceback" not in result.output
