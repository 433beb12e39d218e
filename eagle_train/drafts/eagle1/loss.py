"""EAGLE-1 loss: feature regression plus a soft-CE through the target's head.

Alignment: slot t reads f_t and x_{t+1} and predicts f_{t+1}, whose logits (the target's at
position t+1) predict x_{t+2}; the slot is supervised when x_{t+2} is a real assistant token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Eagle1Loss:
    loss: Tensor  # feature_weight * feature + logit_weight * logit
    feature: Tensor  # SmoothL1, mean over H, masked mean over slots
    logit: Tensor  # soft-CE to softmax(target logits), masked mean over slots
    correct: Tensor  # (B,T) bool: argmax of the predicted logits == the target's argmax


def eagle1_loss(
    pred_feature: Tensor,
    pred_logits: Tensor,
    target_feature: Tensor,
    target_logits: Tensor,
    mask: Tensor,
    feature_weight: float,
    logit_weight: float,
) -> Eagle1Loss:
    """All (B,T,*) aligned on slots: ``target_*`` already taken at position t+1."""
    n = mask.sum().clamp(min=1)
    per_slot = F.smooth_l1_loss(
        pred_feature.float(), target_feature.float(), reduction="none"
    ).mean(-1)
    feature = (per_slot * mask).sum() / n
    p = torch.softmax(target_logits.float(), dim=-1)
    ce = -(p * torch.log_softmax(pred_logits.float(), dim=-1)).sum(-1)
    logit = (ce * mask).sum() / n
    correct = pred_logits.argmax(-1) == target_logits.argmax(-1)
    return Eagle1Loss(
        loss=feature_weight * feature + logit_weight * logit,
        feature=feature,
        logit=logit,
        correct=correct,
    )
