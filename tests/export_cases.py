"""Drafts with distinct weights and their loss on a fixed batch: what an export round trip must
keep."""

from __future__ import annotations

import torch

from eagle_train.data.loader import Batch
from eagle_train.target_model import FrozenTarget


def perturbed_draft(spec, cfg, target: FrozenTarget, seed: int, vocab=None) -> torch.nn.Module:
    torch.manual_seed(seed)
    draft = spec.build(cfg, target, vocab)
    with torch.no_grad():  # every weight distinct, norms included
        for p in draft.parameters():
            if p.requires_grad:
                p.add_(0.1 * torch.randn_like(p))
    return draft.eval()


def loss_of(spec, draft, cfg, target: FrozenTarget) -> torch.Tensor:
    torch.manual_seed(7)  # P-EAGLE samples its elements: the same draw for both drafts
    ids = torch.randint(
        4, target.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3)
    )
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([24, 20]))
    features = target.features(ids, None, spec.target_layer_ids(cfg, target.description))
    with torch.no_grad():
        return spec.compute_loss(draft, features, batch, cfg).loss
