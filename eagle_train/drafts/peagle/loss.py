"""P-EAGLE loss and metrics over the elements of one forward.

KL(target || draft) over the draft vocabulary (or another ``draft.loss``), computed in chunks
of elements (drafts/vocab_loss.py), summed over the supervised elements and divided by the
micro-batch's TOTAL supervised count, so the losses of the parts of a
segmented micro-batch add up to the one-pass loss (and so do their gradients).
"""

from __future__ import annotations

import torch
from torch import Tensor

from eagle_train.drafts.peagle.sampling import Elements
from eagle_train.drafts.vocab_loss import TargetHead, VocabLoss, vocab_loss


def element_positions(e: Elements, t: int) -> Tensor:
    """(B,M) the position whose target logits each element is scored against: a+1+d (the
    target at p predicts x_{p+1}), clamped inside the sequence (padding elements)."""
    return (e.anchor + 1 + e.depth).clamp(max=t - 1)


def peagle_loss(
    hidden: Tensor,
    head_weight: Tensor,
    target: TargetHead,
    e: Elements,
    trained: Tensor,
    total: int,
    loss: str = "forward_kl",
    labels: Tensor | None = None,
) -> tuple[VocabLoss, Tensor]:
    """(the loss and per-element values, per-element KL (B,M)): ``hidden`` (B,M,H) the
    draft's final-normed hidden state per element, ``head_weight`` (Vd,H) its head,
    ``target`` the target's head over the draft vocabulary, ``trained`` (B,M) the elements
    the loss counts, ``labels`` (B,M) draft-vocabulary indices of x_{a+2+d} (-1 outside it;
    ``hard_ce``). The loss is the sum over ``trained`` elements divided by ``total``. The KL
    column is forward KL(target || draft) under ``forward_kl`` (what P-EAGLE logs), else
    the loss's own per-element value."""
    b, m, _ = hidden.shape
    rows = torch.arange(b, device=hidden.device)[:, None].expand(b, m).reshape(-1)
    positions = element_positions(e, target.final.shape[1]).reshape(-1)
    out = vocab_loss(
        hidden.reshape(b * m, -1),
        head_weight,
        trained.reshape(-1).float() / max(total, 1),
        loss,
        target.rows(rows, positions),
        None if labels is None else labels.reshape(-1),
        entropy=loss == "forward_kl",
    )
    kl = out.per_row - out.entropy if loss == "forward_kl" else out.per_row
    return out, kl.view(b, m)


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
