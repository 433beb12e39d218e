"""Issue 24's smaller probes: a folder of data files as input, inf/nan in a config,
``--resume yes``, and ``--resume auto`` with max_steps below the checkpoint's step."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from cli_runs import CONFIG, cli_args, run_sets
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app
from eagle_train.config import ConfigError, load_config
from eagle_train.data.errors import BadRecordPolicy, DataError
from eagle_train.data.records import RecordReader
from eagle_train.run_config import RunConfig


def test_a_folder_of_jsonl_files_reads_every_record_in_path_order(tiny_world: Path, tmp_path: Path):
    """Before: prepare-data given a folder of .jsonl files failed with FileNotFoundError."""
    lines = (tiny_world / "data" / "train.jsonl").read_text().splitlines()
    folder = tmp_path / "chats"
    (folder / "b").mkdir(parents=True)
    (folder / "a.jsonl").write_text("\n".join(lines[:5]) + "\n")
    (folder / "b" / "c.jsonl").write_text("\n".join(lines[5:9]) + "\n")
    (folder / "notes.txt").write_text("not data")
    records = list(RecordReader([folder], BadRecordPolicy("error")))
    ids = [json.loads(x)["id"] for x in lines[:9]]  # the demo chats carry ids
    assert [r.id for r in records] == ids
    assert [r.source for r in records] == [str(folder / "a.jsonl")] * 5 + [
        str(folder / "b" / "c.jsonl")
    ] * 4
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no data files"):
        list(RecordReader([empty], BadRecordPolicy("error")))


@pytest.mark.parametrize("value", ["inf", ".inf", "nan", "-.inf"])
def test_inf_and_nan_are_refused_in_any_number(value: str, tmp_path: Path):
    """Before: optim.lr=inf passed validation and the first step made every weight NaN."""
    sets = run_sets("t", "d", tmp_path, f"optim.lr={value}")
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(RunConfig, CONFIG, sets)


@pytest.mark.parametrize("value", ["yes", "true", "no"])
def test_resume_yes_says_to_write_auto(value: str, tmp_path: Path):
    """Before: --resume yes said "Input should be a valid string (got True)"."""
    with pytest.raises(ConfigError, match="train.resume.*write auto"):
        load_config(RunConfig, CONFIG, run_sets("t", "d", tmp_path, f"train.resume={value}"))


def test_resume_past_max_steps_is_refused_and_at_max_steps_says_so(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, caplog
):
    """Before: --resume auto with max_steps below the checkpoint's step exited 0 silently."""
    out = tmp_path / "run"
    target = tiny_world / "targets" / "llama" / "bf16"
    runner = CliRunner()
    first = runner.invoke(train_draft_app, cli_args(run_sets(target, tiny_llama_data, out)))
    assert first.exit_code == 0, first.output
    metrics = (out / "metrics.jsonl").read_bytes()
    below = run_sets(target, tiny_llama_data, out, "train.max_steps=2")
    result = runner.invoke(train_draft_app, cli_args(below, "--resume", "auto"))
    assert result.exit_code == 2
    assert "step 4, past train.max_steps 2" in result.output
    assert (out / "metrics.jsonl").read_bytes() == metrics
    with caplog.at_level(logging.WARNING):
        same = runner.invoke(
            train_draft_app, cli_args(run_sets(target, tiny_llama_data, out), "--resume", "auto")
        )
    assert same.exit_code == 0, same.output
    assert "nothing left to train" in caplog.text
