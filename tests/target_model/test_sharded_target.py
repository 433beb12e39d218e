"""target.shard: the frozen target FSDP2-sharded over 2 gloo ranks computes the same features
as the whole target, and a short run's losses equal the unsharded run's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed_runs import finish, launch, train_args
from run_configs import target_path

from eagle_train.metrics import read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_sharded_target_features_equal_the_whole_targets(tiny_world: Path, tmp_path: Path):
    target = target_path(tiny_world)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(REPO / "tests" / "sharded_target_worker.py"),
        str(target),
        str(tmp_path),
    ]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, env={**__import__("os").environ, **env}, capture_output=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert result["local_fraction"] == 0.5  # each rank holds half of every layer
        for diffs in result["diffs"]:
            assert diffs == {"aux": 0.0, "final": 0.0, "logits": 0.0}


def test_a_run_with_the_sharded_target_has_the_unsharded_losses(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    losses = {}
    for shard in ("false", "true"):
        out = tmp_path / f"shard-{shard}"
        args = train_args(tiny_world, tiny_llama_data, out, 1, 1)
        args += ["--set", f"target.shard={shard}", "--set", "train.max_steps=6"]
        finish(launch(args, 2, tmp_path / f"pids-{shard}"))
        losses[shard] = [r["loss"] for r in read_metrics(out / "metrics.jsonl", "train")]
    assert len(losses["true"]) == 6
    torch.testing.assert_close(
        torch.tensor(losses["true"]), torch.tensor(losses["false"]), rtol=8e-3, atol=0.0
    )
