"""Training metrics: weighted means over micro-batches, and where they are written
(console, ``metrics.jsonl``, TensorBoard)."""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from eagle_train.fsutil import atomic_write_bytes, is_disk_full, naming_disk_full

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
        """The weighted means; none at all when no batch had a supervised slot (a mean over
        nothing is not 0: a loss 0 or acceptance 0 logged there would be made up)."""
        if self.weight <= 0:
            return {}
        return {k: v / self.weight for k, v in self.sums.items()}


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
        if self.path.is_file():
            repair_metrics(self.path, after_step)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional for the loop
                log.warning("tensorboard is not installed; metrics go to %s only", self.path)
            else:
                self.writer = SummaryWriter(
                    str(out_dir / "tensorboard"), purge_step=after_step + 1 if after_step else None
                )
                # A full disk in TensorBoard's writer thread is raised again (named) by the
                # next write or close here; its thread's own traceback is not printed.
                self._excepthook = threading.excepthook
                threading.excepthook = self._quiet_disk_full

    def _quiet_disk_full(self, args: Any) -> None:
        writer_thread = type(args.thread).__name__ == "_AsyncWriterThread"
        if not (writer_thread and is_disk_full(args.exc_value)):
            self._excepthook(args)

    def write(self, split: str, step: int, metrics: dict[str, float]) -> None:
        with naming_disk_full(self.path.parent, "metrics.jsonl or tensorboard/"):
            with open(self.path, "a") as f:
                f.write(json.dumps({"split": split, "step": step, **metrics}) + "\n")
            if self.writer is not None:
                for key, value in metrics.items():
                    self.writer.add_scalar(f"{split}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            try:
                with naming_disk_full(self.path.parent, "tensorboard/"):
                    self.writer.close()
            finally:
                threading.excepthook = self._excepthook


def repair_metrics(path: Path, after_step: int = 0) -> None:
    """Make ``metrics.jsonl`` safe to append to: drop the records after ``after_step`` (when
    set: a resumed run writes those steps again), and move lines that are not whole records
    (a crash mid-write tears the last one) to ``metrics.jsonl.torn-N``, logged, so nothing
    is lost and every complete line is kept."""
    original = path.read_bytes()
    kept, torn = [], []
    for raw in original.splitlines(keepends=True):
        step = _record_step(raw)
        if step is None:
            torn += [raw] if raw.strip() else []
        elif not after_step or step <= after_step:
            kept.append(raw if raw.endswith(b"\n") else raw + b"\n")
    if torn:
        n = 1
        while path.with_name(f"{path.name}.torn-{n}").exists():
            n += 1
        side = path.with_name(f"{path.name}.torn-{n}")
        atomic_write_bytes(side, b"".join(torn))
        log.warning(
            "%s: %d torn line(s) (a crash while writing) moved to %s; complete lines kept",
            path,
            len(torn),
            side,
        )
    if b"".join(kept) != original:
        atomic_write_bytes(path, b"".join(kept))


def _record_step(raw: bytes) -> int | None:
    """The step of a whole metrics record, None for anything else (a torn line)."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and raw.strip().endswith(b"}") else None


def read_metrics(path: Path, split: str = "train") -> list[dict[str, float]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if r["split"] == split]


def format_metrics(metrics: dict[str, float], keys: tuple[str, ...]) -> str:
    return " ".join(f"{k} {metrics[k]:.4g}" for k in keys if k in metrics)
