"""Checkpoint faults: truncated, corrupt and half-written checkpoints are detected and skipped;
resume refuses what it cannot continue; the loader's sharding and position."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import run_configs
import torch

from eagle_train.checkpoint import (
    CheckpointError,
    checkpoint_problems,
    find_resumable,
    load_draft_checkpoint,
)
from eagle_train.data.loader import BatchLoader, LoaderState, PreparedData
from eagle_train.run_config import RunConfig
from eagle_train.train import train

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"


def run_config(world: Path, data: Path, out: Path, *extra: str) -> RunConfig:
    return run_configs.run_config(
        world,
        data,
        out,
        "data.micro_batch_size=2",
        "data.max_length=48",
        "draft.ttt_steps=1",
        "train.max_steps=6",
        "train.save_every=2",
        "train.keep_last=3",
        *extra,
    )


@pytest.fixture(scope="module")
def checkpoints(tiny_world: Path, tiny_llama_data: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckpt") / "run"
    train(run_config(tiny_world, tiny_llama_data, out))
    return out / "checkpoints"


def copy_run(checkpoints: Path, tmp_path: Path) -> Path:
    root = tmp_path / "checkpoints"
    shutil.copytree(checkpoints, root)
    return root


def test_intact_checkpoints_have_no_problems(checkpoints: Path):
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "step-0000002",
        "step-0000004",
        "step-0000006",
    ]
    assert all(checkpoint_problems(p) == [] for p in checkpoints.iterdir())
    assert find_resumable(checkpoints) == checkpoints / "step-0000006"


def test_truncated_file_is_detected_and_skipped(checkpoints: Path, tmp_path: Path, caplog):
    root = copy_run(checkpoints, tmp_path)
    opt = root / "step-0000006" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])
    problems = checkpoint_problems(root / "step-0000006")
    assert len(problems) == 1 and "optimizer.pt" in problems[0] and "truncated" in problems[0]
    with caplog.at_level(logging.WARNING):
        assert find_resumable(root) == root / "step-0000004"
    assert "skipping checkpoint step-0000006" in caplog.text
    with pytest.raises(CheckpointError, match="truncated"):
        load_draft_checkpoint(root / "step-0000006")  # export refuses it too


def test_corrupt_and_incomplete_checkpoints_are_skipped(checkpoints: Path, tmp_path: Path):
    root = copy_run(checkpoints, tmp_path)
    draft = root / "step-0000006" / "draft.safetensors"
    data = bytearray(draft.read_bytes())
    data[-1] ^= 0xFF  # same size, one flipped byte
    draft.write_bytes(bytes(data))
    (root / "step-0000004" / "trainer_state.json").unlink()  # a writer that never finished
    assert "corrupt" in checkpoint_problems(root / "step-0000006")[0]
    assert "incomplete" in checkpoint_problems(root / "step-0000004")[0]
    assert find_resumable(root) == root / "step-0000002"
    shutil.rmtree(root / "step-0000002")
    with pytest.raises(CheckpointError, match="no usable checkpoint") as err:
        find_resumable(root)
    assert "step-0000006" in str(err.value) and "step-0000004" in str(err.value)
    assert find_resumable(tmp_path / "nothing-here") is None


def test_a_checkpoint_without_a_manifest_is_not_resumed(checkpoints: Path, tmp_path: Path):
    """Checkpoints from before exact resume (no file list, no RNG states) are refused."""
    import json

    root = copy_run(checkpoints, tmp_path)
    state_file = root / "step-0000006" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({"step": state["step"], "loader": state["loader"]}))
    assert "does not record" in checkpoint_problems(root / "step-0000006")[0]
    assert find_resumable(root) == root / "step-0000004"


def test_resume_rules(tiny_world: Path, tiny_llama_data: Path, checkpoints: Path, tmp_path: Path):
    out = tmp_path / "run"
    copy_run(checkpoints, out)
    with pytest.raises(CheckpointError, match="--resume auto"):
        train(run_config(tiny_world, tiny_llama_data, out))
    damaged = out / "checkpoints" / "step-0000002" / "scheduler.pt"
    damaged.write_bytes(b"")
    with pytest.raises(CheckpointError, match="(?s)cannot resume from .*truncated"):
        train(run_config(tiny_world, tiny_llama_data, out, f"train.resume={damaged.parent}"))
    with pytest.raises(CheckpointError, match="draft section differs"):
        train(
            run_config(tiny_world, tiny_llama_data, out, "train.resume=auto", "draft.ttt_steps=2")
        )
    # Extending a finished run: resume from step 6 and go on to 8.
    result = train(
        run_config(tiny_world, tiny_llama_data, out, "train.resume=auto", "train.max_steps=8")
    )
    assert result.last_checkpoint == out / "checkpoints" / "step-0000008"
    # auto with nothing to resume starts fresh.
    fresh = train(
        run_config(
            tiny_world, tiny_llama_data, tmp_path / "new", "train.resume=auto", "train.max_steps=2"
        )
    )
    assert fresh.last_checkpoint.is_dir()


def test_ranks_take_interleaved_micro_batches_of_one_stream(tiny_llama_data: Path):
    """W ranks at one micro-step see what one process sees in W accumulation steps."""
    data = PreparedData(tiny_llama_data)
    single = BatchLoader(data, 3, seed=5, pad_id=0, grad_accum=2)
    ranks = [BatchLoader(data, 3, seed=5, pad_id=0, rank=r, world_size=2) for r in range(2)]
    assert single.batches_per_epoch == ranks[0].batches_per_epoch
    for _ in range(ranks[0].batches_per_epoch // 2 + 3):  # across an epoch boundary
        for loader in ranks:
            assert torch.equal(loader.next().input_ids, single.next().input_ids)
    assert ranks[0].state == ranks[1].state == single.state
    assert single.state.epoch == 1
    again = BatchLoader(data, 3, seed=5, pad_id=0, rank=1, world_size=2)
    again.state = LoaderState(**vars(ranks[1].state))
    assert torch.equal(again.next().input_ids, ranks[1].next().input_ids)
