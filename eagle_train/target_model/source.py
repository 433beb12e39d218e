"""Where a batch's target features come from: the target run now, or a feature cache.

The loop asks one ``FeatureSource`` for each micro-batch's ``TargetFeatures``; it does not
know which kind it holds. From a cache, the stored hidden states and greedy tokens are
read (memory-mapped) and the frozen head recomputes the logits a loss asks for, so nothing but
the head and the embeddings of the target is in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from eagle_train.target_model.cache import CacheChain, FeatureCache, stack_rows, tensor_names
from eagle_train.target_model.frozen import FrozenTarget, TargetFeatures


class Batch(Protocol):
    """What a source reads of the loader's batch (data.loader.Batch)."""

    input_ids: Tensor  # (B, T)
    attention_mask: Tensor  # (B, T)
    lengths: Tensor  # (B,)
    rows: Tensor | None  # (B,) dataset row indices


class FeatureSource(Protocol):
    def for_batch(self, batch: Batch) -> TargetFeatures:
        """The target's features of ``batch`` (already on the training device)."""


@dataclass
class OnlineFeatures:
    """The frozen target's forward at every step (whole, device-mapped or FSDP2-sharded)."""

    target: FrozenTarget
    layer_ids: list[int]

    def for_batch(self, batch: Batch) -> TargetFeatures:
        return self.target.features(batch.input_ids, batch.attention_mask, self.layer_ids)


@dataclass
class CachedFeatures:
    """Rows read from a feature cache, right-padded with zeros like the batch (padding is
    never supervised), with the target's greedy tokens where the cache stored them; logits
    are the frozen head's, computed when asked for."""

    cache: FeatureCache | CacheChain
    head: nn.Module
    layer_ids: list[int]
    device: torch.device

    @torch.no_grad()
    def for_batch(self, batch: Batch) -> TargetFeatures:
        if batch.rows is None:
            raise ValueError("a batch read from a feature cache must carry its dataset rows")
        names = tensor_names(self.layer_ids, self.cache.has_greedy)
        total = batch.input_ids.shape[1]
        parts = [
            self.cache.row(r, n, names)
            for r, n in zip(batch.rows.tolist(), batch.lengths.tolist(), strict=True)
        ]
        read = [t.to(self.device, non_blocking=True) for t in stack_rows(parts, total)]
        greedy = read.pop() if self.cache.has_greedy else None
        *layers, final = read
        aux = torch.cat(layers, dim=-1) if layers else final[..., :0]
        return TargetFeatures(aux=aux, final=final, head=self.head, stored_greedy=greedy)
