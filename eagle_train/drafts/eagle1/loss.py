"""EAGLE-1 loss: feature regression plus a soft-CE (or another ``draft.loss``) through the
target's head.

Alignment: slot t reads f_t and x_{t+1} and predicts f_{t+1}, whose logits (the target's at
position t+1) predict x_{t+2}; the slot is supervised when x_{t+2} is a real assistant token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from eagle_train.drafts.vocab_loss import TargetHead, vocab_loss


@dataclass
class Eagle1Loss:
    loss: Tensor  # feature_weight * feature + logit_weight * logit
    feature: Tensor  # SmoothL1, mean over H, masked mean over slots
    logit: Tensor  # draft.loss (forward_kl: soft-CE to softmax(target logits)), masked mean
    correct: Tensor  # (B,T) bool: argmax of the predicted logits == the target's argmax


def eagle1_loss(
    pred_feature: Tensor,
    head_weight: Tensor,
    target_feature: Tensor,
    target: TargetHead,
    input_ids: Tensor,
    mask: Tensor,
    feature_weight: float,
    logit_weight: float,
    loss: str = "forward_kl",
) -> Eagle1Loss:
    """``pred_feature`` (B,T,H) the predicted f_{t+1} at slot t, ``head_weight`` (V,H) the
    target's frozen head (the logits are made chunk by chunk at the supervised slots:
    drafts/vocab_loss.py), ``target_feature`` (B,T,H) already taken at position t+1,
    ``target`` the target's head and final hidden states (read at t+1), ``input_ids`` (B,T)
    the labels of ``hard_ce`` (x_{t+2})."""
    n = mask.sum().clamp(min=1)
    per_slot = F.smooth_l1_loss(
        pred_feature.float(), target_feature.float(), reduction="none"
    ).mean(-1)
    feature = (per_slot * mask).sum() / n
    rows, slots = mask.nonzero(as_tuple=True)
    out = vocab_loss(
        pred_feature[rows, slots],
        head_weight,
        torch.full((len(rows),), 1.0, device=mask.device) / n,
        loss,
        target.rows(rows, slots + 1),
        input_ids[rows, slots + 2] if loss == "hard_ce" else None,
    )
    correct = torch.zeros_like(mask, dtype=torch.bool)
    correct[rows, slots] = out.draft_argmax == out.target_argmax
    return Eagle1Loss(
        loss=feature_weight * feature + logit_weight * out.loss,
        feature=feature,
        logit=out.loss,
        correct=correct,
    )
