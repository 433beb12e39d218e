"""Learning-rate schedule: linear warmup, then constant or cosine decay to a floor."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

from eagle_train.optim.config import OptimConfig


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int
) -> LambdaLR:
    """A ``LambdaLR`` scaling each group's lr by ``lr_factor`` (stepped once per optimizer step)."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    factor = partial(
        lr_factor,
        warmup_steps=cfg.warmup_steps,
        total_steps=total_steps,
        schedule=cfg.schedule,
        min_lr_ratio=cfg.min_lr_ratio,
    )
    return LambdaLR(optimizer, factor)


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Multiplier of the base lr for the update that follows ``step`` scheduler steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
