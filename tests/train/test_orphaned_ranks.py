"""Issue 24, "a torchrun rank orphaned by its launcher": the launcher is killed with -9 in
the middle of training (2 ranks, gloo). The ranks get the parent-death signal (SIGTERM, the
preemption notice): they finish the step, save it together and exit. What they leave is a
valid run: the lock released, every checkpoint complete (files, sizes and sha256 as its
manifest records), no metrics line after the last checkpoint lost, and ``--resume auto``
ends bitwise equal to a run that was never interrupted."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from distributed_runs import _gone, finish, launch
from preemption_runs import STEPS, args_for, assert_bitwise_equal, wait_for_step

from eagle_train.checkpoint import checkpoint_problems, find_resumable
from eagle_train.fsutil import hold_lock
from eagle_train.metrics import read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_ranks_orphaned_by_a_killed_launcher_leave_a_valid_resumable_run(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before the parent-death signal, the orphans trained on for about 25 s holding the run
    lock; a checkpoint written then must be whole, and the run must resume from it."""
    reference = tmp_path / "reference"
    finish(launch(args_for(tiny_world, tiny_llama_data, reference, 2), 2, tmp_path / "ref"))
    out = tmp_path / "run"
    args = args_for(tiny_world, tiny_llama_data, out, 2)
    proc = launch(args, 2, tmp_path / "pids", EAGLE_TEST_STEP_SLEEP="0.3")
    wait_for_step(proc, out / "metrics.jsonl", 3)
    ranks = [int((tmp_path / "pids" / f"rank-{r}.pid").read_text()) for r in range(2)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=120)  # EOF once the orphaned ranks (writing there) exited
    assert all(_gone(pid, within_s=60) for pid in ranks), "a rank outlived its launcher"
    with hold_lock(out / ".train-draft.lock", "run directory"):  # released: not held
        pass
    checkpoints = sorted((out / "checkpoints").iterdir())
    assert checkpoints and all(c.name.startswith("step-") for c in checkpoints), checkpoints
    for checkpoint in checkpoints:
        assert checkpoint_problems(checkpoint) == [], checkpoint
    saved = find_resumable(out / "checkpoints")
    assert saved is not None and 3 <= int(saved.name[5:]) < STEPS
    logged = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert logged[: int(saved.name[5:])] == list(range(1, int(saved.name[5:]) + 1))
    finish(launch([*args, "--resume", "auto"], 2, tmp_path / "pids"))
    assert_bitwise_equal(reference, out)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
