"""The train-draft arguments of a short run on a feature cache (or on the target, without one)."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, draft_vocab_sets
from run_configs import target_path


def run_sets(
    world: Path, data: Path, features: Path | None, out: Path, algo: str = "eagle3", val=None
):
    sets = [
        f"target.path={target_path(world)}",
        f"data.train={data}",
        f"data.val={val or 'null'}",
        "train.val_every=3",
        "train.val_batches=2",
        "data.micro_batch_size=2",
        "data.max_length=96",
        f"train.output_dir={out}",
        "train.max_steps=6",
        "train.log_every=1",
        "train.save_every=6",
        "train.progress=false",
        "train.tensorboard=false",
        "optim.warmup_steps=2",
        *draft_vocab_sets(algo),
    ]
    if features is not None:
        sets.append(f"data.features={features}")
    return ["-c", str(REPO / "configs" / "train" / f"{algo}-llama-demo.yaml")] + [
        x for s in sets for x in ("--set", s)
    ]
