"""Pieces every draft shares: the RMSNorm vLLM's drafters use, and the target config fields
an exported drafter mirrors."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

# Target config fields the draft mirrors (RoPE, positions, special ids), copied when present.
# max_position_embeddings must cover the serving length (vLLM does not raise it for every
# drafter, and drafting silently stops beyond it): the target's limit covers what it serves.
MIRRORED = ("rope_parameters", "rope_theta", "max_position_embeddings",
            "bos_token_id", "eos_token_id", "pad_token_id")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def mirror_target(config: dict[str, Any], target: PretrainedConfig) -> dict[str, Any]:
    """``config`` with the target's ``MIRRORED`` fields added (those it sets)."""
    for key in MIRRORED:
        value = getattr(target, key, None)
        if value is not None:
            config[key] = value
    return config
