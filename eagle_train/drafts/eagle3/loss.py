"""EAGLE-3 loss and metrics: pure functions of draft logits, the target's logits over the draft
vocabulary, the target's greedy tokens and the mask.

Alignment: target logits (and greedy tokens) at position p predict x_{p+1}. TTT step k at
slot t predicts x_{t+2+k}, so its target distribution is the target's logits at t+1+k and it
is supervised iff ``loss_mask[t+2+k]`` (that token is an assistant token) and t+2+k is inside
the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eagle_train.drafts.eagle_family import valid_slots


@dataclass
class StepStats:
    loss: Tensor  # scalar, weighted over steps, differentiable
    step_losses: list[float]
    correct: list[Tensor]  # per step (B, T) bool: draft argmax == target argmax
    valid: list[Tensor]  # per step (B, T) bool: supervised slots (what metrics count)


def step_weights(num_steps: int, decay: float) -> list[float]:
    """``decay^k`` normalised to sum 1, so the learning rate does not depend on K."""
    raw = [decay**k for k in range(num_steps)]
    return [w / sum(raw) for w in raw]


def eagle3_loss(
    draft_logits: list[Tensor],
    target_draft: Tensor,
    target_greedy: Tensor,
    vocab_size: int,
    loss_mask: Tensor,
    lengths: Tensor,
    d2t: Tensor,
    decay: float,
    drop_out_of_vocab: bool = False,
) -> StepStats:
    """Forward KL (soft CE) to the target distribution restricted to the draft vocab.

    ``draft_logits[k]`` (N_k, Vd): step k's logits at its supervised slots only, those of
    ``supervised_slots(loss_mask, lengths, K)[k]`` in row-major order (the draft's
    ``head_at``), so no head compute goes to prompt or padding slots. ``target_draft``
    (B, T, Vd): the target's logits of the draft vocabulary's tokens (in draft order);
    ``target_greedy`` (B, T): the target's argmax over its whole vocabulary of
    ``vocab_size`` tokens (what greedy verification accepts).

    ``drop_out_of_vocab``: slots whose target argmax is outside the draft vocabulary (the
    draft can never propose it, so they can never be accepted) carry no loss; they still
    count in the metrics, which measure what serving would accept."""
    vd = draft_logits[0].shape[-1]
    draft_to_target = torch.arange(vd, device=d2t.device) + d2t  # (Vd,) target ids
    weights = step_weights(len(draft_logits), decay)
    total = draft_logits[0].new_zeros((), dtype=torch.float32)
    step_losses, correct, valid = [], [], []
    in_vocab = (
        in_draft_vocab(target_greedy, draft_to_target, vocab_size) if drop_out_of_vocab else None
    )
    for k, (logits, mask) in enumerate(
        zip(draft_logits, supervised_slots(loss_mask, lengths, len(draft_logits)), strict=True)
    ):
        rows, slots = mask.nonzero(as_tuple=True)  # row-major, as the draft's head_at
        target_at = (rows, slots + 1 + k)  # the target at t+1+k predicts x_{t+2+k}
        p = torch.softmax(target_draft[target_at].float(), dim=-1)
        per_slot = -(p * torch.log_softmax(logits.float(), dim=-1)).sum(-1)
        if in_vocab is not None:
            trained = in_vocab[target_at]
            step_loss = (per_slot * trained).sum() / trained.sum().clamp(min=1)
        else:
            step_loss = per_slot.sum() / max(len(per_slot), 1)
        total = total + weights[k] * step_loss
        step_losses.append(step_loss.item())
        right = torch.zeros_like(mask)
        right[mask] = draft_to_target[logits.argmax(-1)] == target_greedy[target_at]
        correct.append(right)
        valid.append(mask)
    return StepStats(loss=total, step_losses=step_losses, correct=correct, valid=valid)


def supervised_slots(loss_mask: Tensor, lengths: Tensor, num_steps: int) -> list[Tensor]:
    """Per TTT step k, (B, T) bool: the slots whose drafted token x_{t+2+k} is supervised
    (the slots ``eagle3_loss`` reads ``draft_logits[k]`` at)."""
    return [valid_slots(loss_mask, lengths, k) for k in range(num_steps)]


def in_draft_vocab(target_ids: Tensor, draft_to_target: Tensor, vocab_size: int) -> Tensor:
    """Bool of ``target_ids``' shape: the id is one of the draft vocabulary's target ids."""
    member = torch.zeros(vocab_size, dtype=torch.bool, device=target_ids.device)
    member[draft_to_target.to(target_ids.device)] = True
    return member[target_ids]


def accuracy_metrics(stats: StepStats) -> dict[str, float]:
    """acc_k per step and the simulated acceptance length ``1 + sum_k P(steps 0..k right)``.

    The joint-prefix version: a slot counts for step k only if every step up to k was right,
    which is what a draft chain needs to be accepted.
    """
    out: dict[str, float] = {}
    chain = None
    sim_al = 1.0
    for k, (correct, valid) in enumerate(zip(stats.correct, stats.valid, strict=True)):
        n = valid.sum().clamp(min=1)
        out[f"acc_{k}"] = ((correct & valid).sum() / n).item()
        chain = correct if chain is None else chain & correct
        sim_al += ((chain & valid).sum() / n).item()
    out["sim_accept_len"] = sim_al
    return out
