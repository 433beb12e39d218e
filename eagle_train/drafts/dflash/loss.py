"""DFlash loss and metrics: functions of the draft's block outputs, the (shared, frozen)
head, the sequence and the target's greedy tokens (and logits, for ``distill``); no module
state.

Alignment: block slot k (1..B-1) of the block anchored at a predicts x_{a+k}; the target's
logits at position p predict x_{p+1}, so the target distribution for that slot is the
target's logits at a+k-1, and what greedy verification accepts is their argmax.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# Transient fp32 logits per chunk of blocks (bytes).
_CHUNK_BYTES = 256 * 2**20


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
    head: Callable[[Tensor], Tensor],
    input_ids: Tensor,
    target_greedy: Tensor,
    target_logits: Tensor | None,
    anchors: Tensor,
    mask: Tensor,
    weights: Tensor,
    loss_target: str,
    vocab_size: int,
    chunk_bytes: int = _CHUNK_BYTES,
) -> BlockStats:
    """``hidden`` (Bt, N, B-1, H) draft outputs of slots 1..B-1, ``head`` maps them to
    (.., V) logits, V = ``vocab_size``; ``target_greedy`` (Bt, T) the target's argmax per
    position; ``target_logits`` (Bt, T, V), read by ``distill`` alone (``hard`` takes None);
    ``mask`` (Bt, N, B-1) the supervised slots (``blocks.slot_mask``); ``weights`` (B-1,)
    slot weights.

    Loss = sum(w * m * l) / sum(w * m), l = cross-entropy to x_{a+k}
    (``hard``) or soft cross-entropy to the target's distribution at a+k-1 (``distill``).

    The (Bt, N, B-1, V) logits are the largest tensor of a step (512 blocks of 16 over a
    150k vocabulary: 4.6 GB in fp32 per sequence), so blocks go through the head in chunks,
    each recomputed in backward (activation checkpointing): one chunk's logits live at a time.
    """
    bt, n, slots, _ = hidden.shape
    length = input_ids.shape[1]
    k = torch.arange(1, slots + 1, device=anchors.device)
    # Padding blocks may run past the end: clamp (their weight is 0).
    label_pos = (anchors[..., None] + k).clamp(max=length - 1)  # (Bt, N, B-1)
    w = weights.to(hidden.device)[None, None, :] * mask
    if loss_target == "distill" and target_logits is None:
        raise ValueError("draft.loss_target distill: the target's logits are needed")
    chunk = max(1, chunk_bytes // (4 * bt * slots * vocab_size))
    total = hidden.new_zeros((), dtype=torch.float32)
    draft_argmax = []
    for n0 in range(0, n, chunk):
        args = (hidden[:, n0 : n0 + chunk], label_pos[:, n0 : n0 + chunk], w[:, n0 : n0 + chunk])
        terms = _ChunkTerms(head, input_ids, target_logits, loss_target)
        if torch.is_grad_enabled() and hidden.requires_grad:
            part, argmax = checkpoint(terms, *args, use_reentrant=False)
        else:
            part, argmax = terms(*args)
        total = total + part
        draft_argmax.append(argmax)
    loss = total / w.sum().clamp(min=1e-6)
    target_argmax = _gather_positions(target_greedy, label_pos - 1)
    correct = torch.cat(draft_argmax, dim=1) == target_argmax
    return BlockStats(loss=loss, correct=correct, mask=mask)


class _ChunkTerms:
    """Weighted loss sum and draft argmax of a chunk of blocks (re-run by checkpoint)."""

    def __init__(
        self,
        head: Callable[[Tensor], Tensor],
        input_ids: Tensor,
        target_logits: Tensor | None,
        loss_target: str,
    ) -> None:
        if loss_target not in ("hard", "distill"):
            raise ValueError(
                f"draft.loss_target {loss_target!r}: expected hard or distill (train-draft "
                "resolves auto from the training data before the first step)"
            )
        self.head, self.input_ids, self.target_logits = head, input_ids, target_logits
        self.loss_target = loss_target

    def __call__(self, hidden: Tensor, label_pos: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.head(hidden)
        logq = torch.log_softmax(logits.float(), dim=-1)
        if self.loss_target == "hard":
            labels = _gather_positions(self.input_ids, label_pos)
            per_slot = -logq.gather(-1, labels[..., None]).squeeze(-1)
        else:
            assert self.target_logits is not None  # dflash_loss checked it
            target = _gather_positions(self.target_logits, label_pos - 1).float()
            per_slot = -(torch.softmax(target, dim=-1) * logq).sum(-1)
        return (w * per_slot).sum(), logits.argmax(-1)


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
