"""Packing: training micro-batches cut to a token budget from whole rows of similar length.

A micro-batch keeps its batch dimension (one row per sequence, right-padded), so every
draft's attention, positions and its multi-step training structures stay inside each row
exactly as unpacked; what changes is which rows share a micro-batch. Each epoch's row order is
cut into pools of consecutive rows, each pool sorted by length and cut greedily into
micro-batches whose padded size (rows x longest row) stays within the budget, and the
micro-batches are then shuffled. Rows of similar length share a micro-batch, so little
compute goes to padding; a row longer than the budget is a micro-batch of its own.

``BatchMeter`` counts what the loop consumed (real, padded and supervised tokens, and each
source's supervised tokens) for the trainer's throughput metrics.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import torch
from torch import Tensor

log = logging.getLogger(__name__)

# A pool holds about this many micro-batches' rows: sorting within it groups rows of similar
# length while the epoch's order still decides which rows train together.
POOL_BATCHES = 32


def row_stats(rows, max_length: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(length, supervised tokens) of every row of a prepared ``datasets.Dataset``, after
    the ``max_length`` crop the loader applies; read from the Arrow columns, not row by row."""
    table = rows.data.table if hasattr(rows.data, "table") else rows.data
    ids = pa.concat_arrays(table.column("input_ids").chunks) if len(rows) else None
    masks = pa.concat_arrays(table.column("loss_mask").chunks) if len(rows) else None
    if ids is None or masks is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    offsets = masks.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(ids.offsets.to_numpy().astype(np.int64))
    values = masks.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    if max_length is not None:
        lengths = np.minimum(lengths, max_length)
        position = np.arange(len(values)) - np.repeat(offsets[:-1], np.diff(offsets))
        values = values * (position < max_length)
    parent = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    supervised = np.bincount(parent, weights=values, minlength=len(offsets) - 1).astype(np.int64)
    return lengths, supervised


def default_budget(micro_batch_size: int, lengths: np.ndarray) -> int:
    """``data.max_tokens_per_batch`` when unset: ``micro_batch_size`` rows of the mean
    length, so a packed step sees about as many rows as an unpacked one, minus the padding."""
    mean = float(lengths.mean()) if len(lengths) else 1.0
    return max(1, round(micro_batch_size * mean))


def pack(
    order: list[int], lengths: np.ndarray, budget: int, gen: torch.Generator
) -> list[list[int]]:
    """``order`` cut into micro-batches of at most ``budget`` padded tokens, shuffled by
    ``gen``. Every row of ``order`` is in exactly one micro-batch."""
    mean = float(lengths[order].mean()) if order else 1.0
    pool = max(1, POOL_BATCHES * max(1, int(budget // max(mean, 1.0))))
    batches: list[list[int]] = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lambda r: int(lengths[r]))  # stable
        current: list[int] = []
        for row in chunk:
            # ascending lengths: the row joining is the longest of the micro-batch
            if current and (len(current) + 1) * int(lengths[row]) > budget:
                batches.append(current)
                current = []
            current.append(row)
        if current:
            batches.append(current)
    shuffle = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[i] for i in shuffle]


class BatchMeter:
    """Tokens of the micro-batches taken since the last ``take``: real, padded (what the
    forward computes), supervised, and supervised per data source."""

    def __init__(self, num_sources: int = 1) -> None:
        self.sums = torch.zeros(4 + num_sources, dtype=torch.float64)

    def add(self, loss_mask: Tensor, lengths: Tensor, sources: Tensor) -> None:
        """One micro-batch: its (B, T) loss mask, (B,) lengths and (B,) source index."""
        per_row = loss_mask.sum(1).double()
        self.sums[0] += len(lengths)
        self.sums[1] += float(lengths.sum())
        self.sums[2] += float(loss_mask.numel())
        self.sums[3] += float(per_row.sum())
        self.sums[4:].index_add_(0, sources, per_row)

    def take(self) -> Tensor:
        """The sums so far (rows, real, padded, supervised, per source), then reset."""
        out, self.sums = self.sums, torch.zeros_like(self.sums)
        return out


def meter_metrics(sums: Tensor, elapsed: float, names: list[str]) -> dict[str, float]:
    """Throughput metrics from (all ranks') ``BatchMeter`` sums over ``elapsed`` seconds:
    supervised tokens/s, the fraction of computed tokens that are padding, and, with several
    sources, each source's share of the supervised tokens (``share_<name>``)."""
    _, real, padded, supervised = (float(x) for x in sums[:4])
    out = {
        "supervised_tokens_per_s": supervised / max(elapsed, 1e-9),
        "padding_fraction": 1.0 - real / padded if padded else 0.0,
    }
    if len(names) > 1:
        for name, tokens in zip(names, sums[4:].tolist(), strict=True):
            out[f"share_{name}"] = tokens / supervised if supervised else 0.0
    return out


def packing_budget(
    packing: bool, max_tokens: int | None, micro_batch_size: int, rows, max_length: int | None
) -> int | None:
    """The token budget of a packed training micro-batch (None: packing off): ``max_tokens``
    (data.max_tokens_per_batch) or, unset, ``default_budget`` over the (cropped) rows."""
    if not packing:
        return None
    lengths = row_stats(rows, max_length)[0]
    budget = max_tokens if max_tokens is not None else default_budget(micro_batch_size, lengths)
    log.info(
        "packing: micro-batches of whole rows up to %d padded tokens (%s; longest row %d)",
        budget,
        "data.max_tokens_per_batch"
        if max_tokens is not None
        else f"{micro_batch_size} rows of the mean length",
        int(lengths.max()) if len(lengths) else 0,
    )
    return budget
