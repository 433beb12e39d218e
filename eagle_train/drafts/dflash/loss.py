"""DFlash loss and metrics: functions of the draft's block outputs, the (shared, frozen)
head, the sequence and the target's greedy tokens (and its head and final hidden states, for
the losses that read its distribution); no module state.

Alignment: block slot k (1..B-1) of the block anchored at a predicts x_{a+k}; the target's
logits at position p predict x_{p+1}, so the target distribution for that slot is the
target's logits at a+k-1, and what greedy verification accepts is their argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eagle_train.drafts.vocab_loss import LOSS_NAMES, TargetHead, vocab_loss


@dataclass
class BlockStats:
    loss: Tensor  # scalar, slot-weighted mean over real blocks, differentiable
    correct: Tensor  # (Bt, N, B-1) bool: draft argmax == target argmax at a+k-1
    mask: Tensor  # (Bt, N, B-1) bool: supervised slots of real blocks


def _gather_positions(x: Tensor, positions: Tensor) -> Tensor:
    """x (Bt, T, ...) at positions (Bt, N, K) -> (Bt, N, K, ...)."""
    bt, n, k = positions.shape
    flat = positions.reshape(bt, n * k)
    index = flat.view(bt, n * k, *([1] * (x.dim() - 2))).expand(bt, n * k, *x.shape[2:])
    return x.gather(1, index).view(bt, n, k, *x.shape[2:])


def dflash_loss(
    hidden: Tensor,
    head_weight: Tensor,
    input_ids: Tensor,
    target_greedy: Tensor,
    target: TargetHead | None,
    anchors: Tensor,
    mask: Tensor,
    weights: Tensor,
    loss: str,
) -> BlockStats:
    """``hidden`` (Bt, N, B-1, H) draft outputs of slots 1..B-1, ``head_weight`` (V, H) the
    head that maps them to logits over the target's V tokens; ``target_greedy`` (Bt, T) the
    target's argmax per position; ``target`` the target's head and final hidden states,
    read by every loss but ``hard_ce`` (which takes None); ``mask`` (Bt, N, B-1) the
    supervised slots (``blocks.slot_mask``); ``weights`` (B-1,) slot weights; ``loss`` a
    ``draft.loss`` name (auto resolved before).

    Loss = sum(w * m * l) / sum(w * m), l = cross-entropy to x_{a+k} (``hard_ce``) or the
    menu's divergence to the target's distribution at a+k-1 (``forward_kl``: soft CE).

    The (Bt, N, B-1, V) logits would be the largest tensor of a step (512 blocks of 16 over a
    150k vocabulary: 4.6 GB in fp32 per sequence), so slots go through the head in chunks
    (``vocab_loss``): one chunk's logits live at a time, and none is kept for backward.
    """
    bt, n, slots, _ = hidden.shape
    length = input_ids.shape[1]
    k = torch.arange(1, slots + 1, device=anchors.device)
    # Padding blocks may run past the end: clamp (their weight is 0).
    label_pos = (anchors[..., None] + k).clamp(max=length - 1)  # (Bt, N, B-1)
    w = weights.to(hidden.device)[None, None, :] * mask
    if loss not in LOSS_NAMES:
        raise ValueError(
            f"draft.loss {loss!r}: expected one of {', '.join(LOSS_NAMES)} (train-draft "
            "resolves auto from the training data before the first step)"
        )
    if loss != "hard_ce" and target is None:
        raise ValueError(f"draft.loss {loss}: the target's logits are needed")
    rows = torch.arange(bt, device=hidden.device)[:, None, None].expand_as(label_pos)
    out = vocab_loss(
        hidden.reshape(bt * n * slots, -1),
        head_weight,
        (w / w.sum().clamp(min=1e-6)).reshape(-1),
        loss,
        None
        if loss == "hard_ce" or target is None
        else target.rows(rows.reshape(-1), (label_pos - 1).reshape(-1)),
        _gather_positions(input_ids, label_pos).reshape(-1) if loss == "hard_ce" else None,
    )
    target_argmax = _gather_positions(target_greedy, label_pos - 1)
    correct = out.draft_argmax.view(bt, n, slots) == target_argmax
    return BlockStats(loss=out.loss, correct=correct, mask=mask)


def accuracy_metrics(stats: BlockStats) -> dict[str, float]:
    """acc_k (slot k+1 right among supervised slots k+1, k=0..B-2) and the simulated
    acceptance length of a block, ``1 + sum_k P(slots 1..k+1 all right)`` (greedy
    verification accepts a prefix), each term over the blocks whose slot k+1 is supervised."""
    mask = stats.mask
    n = mask.sum((0, 1)).clamp(min=1)  # (B-1,)
    acc = ((stats.correct & mask).sum((0, 1)) / n).tolist()
    prefix = (stats.correct.int().cumprod(-1).bool() & mask).sum((0, 1)) / n
    out = {f"acc_{k}": a for k, a in enumerate(acc)}
    out["sim_accept_len"] = 1.0 + float(prefix.sum())
    return out
