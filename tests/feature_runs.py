"""The train-draft arguments of a short run on a feature cache (or on the target, without one)."""

from __future__ import annotations

from pathlib import Path

from run_configs import cli_args, run_sets


def feature_run_args(
    world: Path, data: Path, features: Path | None, out: Path, algo: str = "eagle3", val=None
):
    sets = run_sets(
        world,
        data,
        out,
        f"data.val={val or 'null'}",
        "train.val_every=3",
        "train.val_batches=2",
        "data.micro_batch_size=2",
        "data.max_length=96",
        "train.max_steps=6",
        "train.log_every=1",
        "train.save_every=6",
        "optim.warmup_steps=2",
        *([f"data.features={features}"] if features is not None else []),
        algo=algo,
    )
    return cli_args(sets, algo)
