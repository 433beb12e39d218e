"""A P-EAGLE draft with non-trivial weights on a given target."""

from __future__ import annotations

import torch

from eagle_train.drafts.peagle.config import PEagleConfig
from eagle_train.drafts.registry import get_draft
from eagle_train.target_model import FrozenTarget


def build(target: FrozenTarget, **kwargs):
    cfg = PEagleConfig(
        **{"aux_layer_ids": [1, 2, 3], "num_layers": 2, "parallel_steps": 3, **kwargs}
    )
    torch.manual_seed(0)
    draft = SPEC.build(cfg, target, None)
    with torch.no_grad():  # non-trivial everywhere (mask_hidden starts at 0)
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return cfg, draft


SPEC = get_draft("peagle")
