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

    def merge(self, other: WeightedMean) -> None:
        for key, value in other.sums.items():
            self.sums[key] += value
        self.weight += other.weight

    def result(self) -> dict[str, float]:
        return {k: v / max(self.weight, 1) for k, v in self.sums.items()}


class MetricSink:
    """Where a rank's metrics go: nowhere (ranks other than 0); ``MetricLog`` writes them."""

    def write(self, split: str, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class MetricLog(MetricSink):
    """Appends one JSON line per record; mirrors scalars to TensorBoard when enabled.

    ``after_step``: a resumed run first drops the records its killed predecessor wrote
    after the checkpoint it resumes from, so every step appears once."""

    def __init__(self, out_dir: Path, tensorboard: bool, after_step: int = 0) -> None:
        self.path = out_dir / "metrics.jsonl"
        self.writer: Any = None
        if after_step and self.path.is_file():
            _truncate_after(self.path, after_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional for the loop
                log.warning("tensorboard is not installed; metrics go to %s only", self.path)
            else:
                self.writer = SummaryWriter(
                    str(out_dir / "tensorboard"), purge_step=after_step + 1 if after_step else None
                )

    def write(self, split: str, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"split": split, "step": step, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(f"{split}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _truncate_after(path: Path, step: int) -> None:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def read_metrics(path: Path, split: str = "train") -> list[dict[str, float]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if r["split"] == split]


def format_metrics(metrics: dict[str, float], keys: tuple[str, ...]) -> str:
    return " ".join(f"{k} {metrics[k]:.4g}" for k in keys if k in metrics)
