"""Copy supervision: teach one attention head of the draft's first layer to find, at slot t,
the earlier place where the text continued as it is about to continue now (an induction
head), the mechanism an n-gram proposer has and a drafter trained on next-token loss alone
did not find on SmolLM2 (docs/results/2026-12-03-why-the-drafter-does-not-copy.md).

At TTT step 0, slot t's query reads token x_{t+1} (the embedding half) and the key at slot j
reads the target's features at j (which hold x_j), so the head can match x_j == x_{t+1}; the
value at j holds x_{j+1} (its embedding half), which is what should come next. The head's
attention at slot t is supervised toward the keys j in [1, t] with x_j == x_{t+1} and
x_{j+1} == x_{t+2} (uniformly), and toward key 0 when there is none (a place to rest), on
the slots whose token x_{t+2} is supervised. The weights stay those vLLM serves; only the
loss changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from eagle_train.drafts.eagle_family import shift_left, valid_slots


@dataclass
class CopyStats:
    loss: Tensor  # scalar: mean cross-entropy of the head's attention to its targets
    mass: float  # mean attention on the matching keys, over slots that have one
    slots: int  # slots that have a matching key


def copy_targets(input_ids: Tensor) -> Tensor:
    """(B, T, T) bool: key j matches slot t (1 <= j <= t, x_j == x_{t+1}, x_{j+1} == x_{t+2}).

    Tokens past the end repeat the last id (``shift_left``); the loss masks those slots."""
    _, t = input_ids.shape
    nxt, after = shift_left(input_ids, 1), shift_left(input_ids, 2)
    same_token = input_ids[:, None, :] == nxt[:, :, None]  # [b, t, j]: x_j == x_{t+1}
    same_next = nxt[:, None, :] == after[:, :, None]  # x_{j+1} == x_{t+2}
    rows = torch.arange(t, device=input_ids.device)[:, None]
    cols = torch.arange(t, device=input_ids.device)[None, :]
    return same_token & same_next & (cols <= rows) & (cols >= 1)


def copy_attention_loss(
    q: Tensor, k: Tensor, input_ids: Tensor, loss_mask: Tensor, lengths: Tensor
) -> CopyStats:
    """``q``, ``k`` (B, T, D): the supervised head's step-0 query and key, rotary applied."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    t = q.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    logp = torch.log_softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    matches = copy_targets(input_ids)
    has_match = matches.any(-1)
    target = matches.float()
    target[..., 0] = target[..., 0] + (~has_match).float()  # no match: rest on key 0
    target = target / target.sum(-1, keepdim=True)
    counted = valid_slots(loss_mask, lengths, 0)
    per_slot = -(target * logp.masked_fill(~causal, 0.0)).sum(-1)
    loss = (per_slot * counted).sum() / counted.sum().clamp(min=1)
    with torch.no_grad():
        on_match = counted & has_match
        mass = (logp.exp() * matches).sum(-1)
        n = int(on_match.sum())
        mean_mass = float((mass * on_match).sum() / max(n, 1))
    return CopyStats(loss=loss, mass=mean_mass, slots=n)
