"""The overrides of a 12-step demo training run with validation and checkpoints."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, draft_vocab_sets
from run_configs import target_path

CONFIG = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"


def overrides(world: Path, data: Path, out: Path, steps: int = 12) -> list[str]:
    return [
        f"target.path={target_path(world)}",
        f"data.train={data}",
        f"data.val={data}",
        "data.micro_batch_size=4",
        "data.max_length=128",
        f"train.output_dir={out}",
        f"train.max_steps={steps}",
        "train.log_every=4",
        "train.val_every=6",
        "train.val_batches=2",
        "train.save_every=6",
        "train.keep_last=1",
        "train.progress=false",
        "optim.warmup_steps=2",
        *draft_vocab_sets("eagle3"),
    ]
