"""A 40,000-token target and the losses written from their definitions over the whole vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM

from eagle_train.drafts.vocab_loss import LK_ETA
from eagle_train.target_model import FrozenTarget

VOCAB = 40_000  # the target's


def reference(loss: str, z: Tensor, t: Tensor, labels: Tensor) -> Tensor:
    """Per-row loss from whole-vocabulary logits, written from the definitions."""
    logq, logp = torch.log_softmax(z, -1), torch.log_softmax(t, -1)
    p, q = logp.exp(), logq.exp()
    kl_pq = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)  # KL(p||q)
    # total variation as one minus the overlap (the acceptance rate); its value is half the
    # L1 distance (its gradient differs from the L1 form's by a constant times sum(dq) = 0,
    # which fp32 does not cancel exactly over 40k tokens, so the overlap form is compared)
    tv = 1 - torch.minimum(p, q).sum(-1)
    torch.testing.assert_close(tv, 0.5 * (p - q).abs().sum(-1), rtol=1e-4, atol=1e-5)
    if loss == "forward_kl":
        return -(p * logq).sum(-1)  # soft cross-entropy
    if loss == "reverse_kl":
        return F.kl_div(logp, logq, log_target=True, reduction="none").sum(-1)  # KL(q||p)
    if loss == "jsd":
        m = (p + q) / 2
        return 0.5 * (p * (logp - m.log())).sum(-1) + 0.5 * (q * (logq - m.log())).sum(-1)
    if loss == "tv":
        return tv
    if loss == "lk":
        lam = torch.exp(-LK_ETA * (1 - tv).detach())  # exp(-eta * alpha), not differentiated
        return lam * kl_pq + (1 - lam) * tv
    ce = F.cross_entropy(z, labels.clamp(min=0), reduction="none")
    return torch.where(labels >= 0, ce, torch.zeros_like(ce))


def wide_target() -> FrozenTarget:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return FrozenTarget(LlamaForCausalLM(config).float())


DRAFT_SETTINGS = {
    "eagle1": {},
    "eagle3": {"aux_layer_ids": [1, 2, 3], "ttt_steps": 3},
    "peagle": {"aux_layer_ids": [1, 2, 3], "mask_token_id": 3, "num_layers": 1},
    "dflash": {"target_layer_ids": [0, 1, 2], "num_layers": 1, "block_size": 4, "mask_token_id": 3},
}
