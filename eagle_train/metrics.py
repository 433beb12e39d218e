"""Training metrics: weighted means over micro-batches, and where they are written
(console, ``metrics.jsonl``, TensorBoard)."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class WeightedMean:
    """Combine per-batch metric means, each weighted by its number of supervised slots."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weight = 0

    def add(self, metrics: dict[str, float], weight: int) -> None:
        for key, value in metrics.items():
            self.sums[key] += value * weight
        self.weight += weight

    def result(self) -> dict[str, float]:
        return {k: v / max(self.weight, 1) for k, v in self.sums.items()}


class MetricLog:
    """Appends one JSON line per record; mirrors scalars to TensorBoard when enabled."""

    def __init__(self, out_dir: Path, tensorboard: bool) -> None:
        self.path = out_dir / "metrics.jsonl"
        self.writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional for the loop
                log.warning("tensorboard is not installed; metrics go to %s only", self.path)
            else:
                self.writer = SummaryWriter(str(out_dir / "tensorboard"))

    def write(self, split: str, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"split": split, "step": step, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(f"{split}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: Path, split: str = "train") -> list[dict[str, float]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if r["split"] == split]


def format_metrics(metrics: dict[str, float], keys: tuple[str, ...]) -> str:
    return " ".join(f"{k} {metrics[k]:.4g}" for k in keys if k in metrics)
