"""Copy supervision: teach attention heads of the draft's first layer (one per key/value
group, ``draft.copy_heads`` of them: each group has its own value) to find, at slot t,
the earlier place where the text continued as it is about to continue now (an induction
head), the mechanism an n-gram proposer has and a drafter trained on next-token loss alone
did not find on SmolLM2 (docs/results/2026-12-03-why-the-drafter-does-not-copy.md).

At TTT step s, slot t's query reads token x_{t+1+s} (the embedding half) and the step-0 key
at slot j reads the target's features at j (which hold x_j), so the head can match
x_j == x_{t+1+s}; the value at j holds x_{j+1} (its embedding half), which is what should
come next. Each copy head's attention at slot t is supervised toward the keys j in [1, t] with
x_j == x_{t+1+s} and x_{j+1} == x_{t+2+s} (uniformly), and toward key 0 when there is none
(a place to rest), on the slots whose token x_{t+2+s} is supervised. At s >= 1 the softmax
also spans the slot's own chain keys of steps 1..s (as in training-time test and in vLLM's
draft KV cache); they get no target mass. The weights stay those vLLM serves; only the loss
changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from eagle_train.drafts.eagle_family import shift_left, valid_slots
from eagle_train.drafts.ttt_attention import chain_scores, rows_per_chunk

# fp32 scores per chunk of slots (bytes): the (B, N, chunk, T) tensors of one chunk.
_CHUNK_BYTES = 64 * 2**20


@dataclass
class CopyStats:
    loss: Tensor  # scalar: per-step cross-entropy of the head's attention, mean over steps
    mass: list[float]  # per step: mean attention on the matching keys, over slots with one
    slots: list[int]  # per step: slots that have a matching key


def copy_targets(
    input_ids: Tensor, step: int = 0, start: int = 0, end: int | None = None
) -> Tensor:
    """(B, end - start, end) bool: key j matches slot t (rows ``[start, end)``, default all)
    at TTT step ``step``: 1 <= j <= t, x_j == x_{t+1+step} and x_{j+1} == x_{t+2+step}.

    Tokens past the end repeat the last id (``shift_left``); the loss masks those slots."""
    end = input_ids.shape[1] if end is None else end
    query_token = shift_left(input_ids, 1 + step)[:, start:end]
    after = shift_left(input_ids, 2 + step)[:, start:end]
    same_token = input_ids[:, None, :end] == query_token[:, :, None]  # [b, t, j]
    same_next = shift_left(input_ids, 1)[:, None, :end] == after[:, :, None]
    rows = torch.arange(start, end, device=input_ids.device)[:, None]
    cols = torch.arange(end, device=input_ids.device)[None, :]
    return same_token & same_next & (cols <= rows) & (cols >= 1)


def copy_log_attention(
    probed: list[tuple[Tensor, Tensor]], step: int, start: int = 0, end: int | None = None
) -> Tensor:
    """(B, N, end - start, end) fp32 log attention of the copy heads at TTT step ``step``
    over the context keys, for the slots ``[start, end)`` (default all; the chain keys of
    steps 1..step share the softmax). ``probed[s]``: the heads' queries and keys
    (B, N, T, D) at step s, rotary applied; the scores are those training-time-test
    attention computes (``chain_scores``)."""
    context, q = probed[0][1], probed[step][0]
    b, n, t, d = context.shape
    end = t if end is None else end
    chain = [k[:, :, start:end] for _, k in probed[1 : step + 1]]
    chain_keys = torch.stack(chain, dim=3) if chain else context.new_empty(b, n, end - start, 0, d)
    scores = chain_scores(q[:, :, start:end].float(), context, chain_keys, start, 1 / math.sqrt(d))
    return torch.log_softmax(scores, dim=-1)[..., :end]


def _chunk_terms(
    input_ids: Tensor, counted: Tensor, step: int, start: int, end: int, *probed_flat: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Slots ``[start, end)`` at step ``step``: the loss summed over counted slots, and
    (no grad) the attention mass on matching keys summed over counted slots with a match,
    and their number. Recomputed in backward (checkpoint): nothing (T, T)-sized is kept."""
    probed = list(zip(probed_flat[0::2], probed_flat[1::2], strict=True))
    logp = copy_log_attention(probed, step, start, end)
    matches = copy_targets(input_ids, step, start, end)
    has_match = matches.any(-1)
    target = matches.float()
    target[..., 0] = target[..., 0] + (~has_match).float()  # no match: rest on key 0
    target = (target / target.sum(-1, keepdim=True))[:, None]
    rows = torch.arange(start, end, device=input_ids.device)[:, None]
    future = torch.arange(end, device=input_ids.device)[None, :] > rows
    per_slot = -(target * logp.masked_fill(future, 0.0)).sum(-1).mean(1)  # (B, c)
    counted = counted[:, start:end]
    with torch.no_grad():
        on_match = counted & has_match
        mass = (logp.exp() * matches[:, None]).sum(-1).mean(1)
        mass_sum, matched = (mass * on_match).sum(), on_match.sum()
    return (per_slot * counted).sum(), mass_sum, matched


def copy_attention_loss(
    probed: list[tuple[Tensor, Tensor]], input_ids: Tensor, loss_mask: Tensor, lengths: Tensor
) -> CopyStats:
    """``probed[s]``: the copy heads' queries and keys (B, N, T, D) at TTT step s (see
    ``copy_log_attention``). Loss and mass are means over the N heads too. The slots run in
    chunks whose scores are recomputed in backward, so memory grows with T, not T x T."""
    losses, masses, counts = [], [], []
    b, n, t, _ = probed[0][1].shape
    chunk = rows_per_chunk(b, n, t, _CHUNK_BYTES)
    for step in range(len(probed)):
        counted = valid_slots(loss_mask, lengths, step)
        flat = [x for pair in probed[: step + 1] for x in pair]
        sums = [
            checkpoint(
                _chunk_terms,
                input_ids,
                counted,
                step,
                start,
                min(t, start + chunk),
                *flat,
                use_reentrant=False,
            )
            for start in range(0, t, chunk)
        ]
        total, mass_sum, hits = (torch.stack(column).sum() for column in zip(*sums, strict=True))
        matched = int(hits)  # one host read per step
        losses.append(total / counted.sum().clamp(min=1))
        masses.append(float(mass_sum) / max(matched, 1))
        counts.append(matched)
    return CopyStats(loss=torch.stack(losses).mean(), mass=masses, slots=counts)
