"""DFlash loss and metrics: pure functions of block logits, the sequence and the target.

Alignment: block slot k (1..B-1) of the block anchored at a predicts x_{a+k}; the target's
logits at position p predict x_{p+1}, so the target distribution for that slot is the
target's logits at a+k-1, and what greedy verification accepts is their argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class BlockStats:
    loss: Tensor  # scalar, slot-weighted mean over real blocks, differentiable
    correct: Tensor  # (Bt, N, B-1) bool: draft argmax == target argmax at a+k-1
    valid: Tensor  # (Bt, N) bool: real blocks


def _gather_positions(x: Tensor, positions: Tensor) -> Tensor:
    """x (Bt, T, ...) at positions (Bt, N, K) -> (Bt, N, K, ...)."""
    bt, n, k = positions.shape
    flat = positions.reshape(bt, n * k)
    index = flat.view(bt, n * k, *([1] * (x.dim() - 2))).expand(bt, n * k, *x.shape[2:])
    return x.gather(1, index).view(bt, n, k, *x.shape[2:])


def dflash_loss(
    logits: Tensor, input_ids: Tensor, target_logits: Tensor, anchors: Tensor, valid: Tensor,
    weights: Tensor, loss_target: str,
) -> BlockStats:
    """``logits`` (Bt, N, B-1, V) for slots 1..B-1; ``weights`` (B-1,) slot weights.

    Loss = sum(w * l) / sum(w) over the slots of real blocks, l = cross-entropy to x_{a+k}
    (``hard``) or soft cross-entropy to the target's distribution at a+k-1 (``distill``).
    """
    length = input_ids.shape[1]
    k = torch.arange(1, logits.shape[2] + 1, device=anchors.device)
    # Padding blocks may run past the end: clamp (their weight is 0).
    label_pos = (anchors[..., None] + k).clamp(max=length - 1)  # (Bt, N, B-1)
    logq = torch.log_softmax(logits.float(), dim=-1)
    if loss_target == "hard":
        labels = _gather_positions(input_ids, label_pos)
        per_slot = -logq.gather(-1, labels[..., None]).squeeze(-1)
    else:
        p = torch.softmax(_gather_positions(target_logits, label_pos - 1).float(), dim=-1)
        per_slot = -(p * logq).sum(-1)
    w = weights.to(per_slot.device)[None, None, :] * valid[..., None]
    loss = (w * per_slot).sum() / w.sum().clamp(min=1e-6)
    target_argmax = _gather_positions(target_logits.argmax(-1), label_pos - 1)
    correct = logits.argmax(-1) == target_argmax
    return BlockStats(loss=loss, correct=correct, valid=valid)


def accuracy_metrics(stats: BlockStats) -> dict[str, float]:
    """acc_k (slot k+1 right, k=0..B-2) and the simulated acceptance length of a block,
    ``1 + sum_k P(slots 1..k+1 all right)`` (greedy verification accepts a prefix)."""
    valid = stats.valid[..., None]
    n = stats.valid.sum().clamp(min=1)
    acc = ((stats.correct & valid).sum((0, 1)) / n).tolist()
    prefix = (stats.correct.int().cumprod(-1).bool() & valid).sum((0, 1)) / n
    out = {f"acc_{k}": a for k, a in enumerate(acc)}
    out["sim_accept_len"] = 1.0 + float(prefix.sum())
    return out

