"""P-EAGLE loss and metrics over the elements of one forward.

KL(target || draft) over the draft vocabulary, summed over the supervised elements and
divided by the micro-batch's TOTAL supervised count, so the losses of the parts of a
segmented micro-batch add up to the one-pass loss (and so do their gradients).
"""

from __future__ import annotations

import torch
from torch import Tensor

from eagle_train.drafts.peagle.sampling import Elements


def element_targets(target_draft: Tensor, e: Elements) -> Tensor:
    """(B,M,Vd) target logits for each element: the target's at position a+1+d."""
    t = target_draft.shape[1]
    pos = (e.anchor + 1 + e.depth).clamp(max=t - 1)
    return target_draft.gather(1, pos[..., None].expand(-1, -1, target_draft.shape[-1]))


def peagle_loss(
    logits: Tensor, target: Tensor, supervised: Tensor, total: int
) -> tuple[Tensor, Tensor]:
    """(loss, per-element KL): ``logits``/``target`` (B,M,Vd), ``supervised`` (B,M)."""
    logp = torch.log_softmax(target.float(), dim=-1)
    logq = torch.log_softmax(logits.float(), dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # (B,M)
    return (kl * supervised).sum() / max(total, 1), kl


def depth_metrics(
    correct: Tensor, supervised: Tensor, e: Elements, t: int, depths: int
) -> dict[str, float]:
    """acc_d over supervised depth-d elements and the simulated acceptance length
    ``1 + sum_d P(depths 0..d all right)`` (an anchor's elements are nested over depths)."""
    b = correct.shape[0]
    grid = torch.zeros(b, t, depths, dtype=torch.bool, device=correct.device)
    rows = torch.arange(b, device=correct.device)[:, None]
    grid[rows, e.anchor, e.depth] = correct & e.valid
    chain = grid.cumprod(-1).bool()[rows, e.anchor, e.depth]
    out: dict[str, float] = {}
    sim_al = 1.0
    for d in range(depths):
        sel = supervised & (e.depth == d)
        n = max(int(sel.sum()), 1)
        out[f"acc_{d}"] = (correct & sel).sum().item() / n
        sim_al += (chain & sel).sum().item() / n
    out["sim_accept_len"] = sim_al
    return out
