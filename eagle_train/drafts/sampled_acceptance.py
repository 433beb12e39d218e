"""The simulated acceptance length at a serving temperature, for every draft algorithm.

vLLM 0.32 drafts greedily by default (``draft_sample_method="greedy"``, the only choice for a
draft vocabulary of its own) and verifies by rejection sampling with no draft
probabilities: the drafted token x is accepted with probability min(1, p(x) / q(x)) for
q = 1, i.e. ``p(x)``, where p is the target's distribution after temperature, top-k and
top-p (in that order, as vLLM's sampler). A chain stops at its first rejection, so with
teacher-forced proposals (``spec.propose``: entry [t, k] guesses x_{t+2+k} from the true
tokens before it, as the greedy estimate does) the expected accepted length of a cycle
starting at slot t is ``sum_k prod_{j<=k} p_{t+1+j}(proposal[t, j])``, plus the bonus token.
At temperature 0 p is one-hot at the target's argmax and this is the greedy estimate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from eagle_train.data.loader import Batch
from eagle_train.drafts.base import DraftSpec
from eagle_train.target_model import TargetFeatures


def serving_probs(logits: Tensor, temperature: float, top_p: float, top_k: int | None) -> Tensor:
    """(..., V) the target's sampling distribution as vLLM forms it: logits / temperature,
    then the top ``top_k`` kept, then the smallest most-likely set of mass >= ``top_p``."""
    if temperature <= 0:
        raise ValueError(f"temperature {temperature}: the sampled estimate needs temperature > 0")
    scaled = logits.float() / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass ranked above each token
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def chain_acceptance_length(accept: Tensor, valid: Tensor) -> float:
    """``accept`` (B, T, K) probability that step k of the cycle at slot t is accepted given
    that the steps before it were; ``valid`` (B, T, K) the supervised slots of each step.
    Returns ``1 + sum_k mean over valid slots of prod_{j<=k} accept[..., j]``."""
    chain = accept.cumprod(-1)
    total = 1.0
    for k in range(accept.shape[-1]):
        n = valid[..., k].sum().clamp(min=1)
        total += float((chain[..., k] * valid[..., k]).sum() / n)
    return total


def step_validity(loss_mask: Tensor, lengths: Tensor, num_steps: int) -> Tensor:
    """(B, T, K) bool: step k at slot t predicts x_{t+2+k}, an assistant token inside the
    sequence."""
    b, t = loss_mask.shape
    pos = torch.arange(t, device=loss_mask.device)[:, None] + 2 + torch.arange(num_steps)[None]
    inside = pos[None] < lengths[:, None, None]
    clamped = pos.clamp(max=t - 1).expand(b, t, num_steps)
    return inside & loss_mask.bool().gather(1, clamped.reshape(b, -1)).view(b, t, num_steps)


@torch.no_grad()
def sampled_acceptance_metrics(
    spec: DraftSpec,
    draft: torch.nn.Module,
    features: TargetFeatures,
    batch: Batch,
    cfg: Any,
    num_steps: int,
    sampling: tuple[float, float, int | None],
) -> dict[str, float]:
    """``{"sim_accept_len_sampled": ...}`` for ``sampling`` = (temperature, top_p, top_k)
    over ``num_steps`` draft steps (the greedy estimate's depth)."""
    proposals = spec.propose(draft, features, batch.input_ids, cfg, num_steps)  # (B, T, K)
    probs = serving_probs(features.logits, *sampling)  # (B, T, V), once
    b, t, _ = proposals.shape
    rows = torch.arange(b, device=probs.device)[:, None]
    accept = torch.empty(proposals.shape, dtype=torch.float32, device=probs.device)
    for k in range(num_steps):
        # the target's distribution for x_{t+2+k} sits at position t+1+k
        pos = (torch.arange(t, device=probs.device) + 1 + k).clamp(max=t - 1)
        accept[..., k] = probs[rows, pos[None, :], proposals[..., k].to(probs.device)]
    valid = step_validity(batch.loss_mask, batch.lengths, num_steps).to(accept.device)
    return {"sim_accept_len_sampled": chain_acceptance_length(accept, valid)}


def sampled_estimate(
    spec: DraftSpec,
    draft: torch.nn.Module,
    features: TargetFeatures,
    batch: Batch,
    cfg: Any,
    greedy_metrics: dict[str, float],
    sampling: Any,
) -> dict[str, float]:
    """Validation's sampled estimate beside the greedy one, over as many steps as the greedy
    metrics have ``acc_k``; ``sampling`` has temperature/top_p/top_k (train.acceptance's).
    Empty at temperature 0, where it would equal the greedy estimate."""
    if sampling.temperature == 0:
        return {}
    steps = sum(key.startswith("acc_") for key in greedy_metrics)
    settings = (sampling.temperature, sampling.top_p, sampling.top_k)
    return sampled_acceptance_metrics(spec, draft, features, batch, cfg, steps, settings)
