"""EAGLE-3 loss and metrics: pure functions of the draft's last hidden states and head, the
target's head over the draft vocabulary and its final hidden states, the target's greedy
tokens and the mask (the logits are made chunk by chunk: drafts/vocab_loss.py).

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
from eagle_train.drafts.vocab_loss import TargetHead, vocab_loss


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
    hidden: list[Tensor],
    head_weight: Tensor,
    target: TargetHead,
    target_greedy: Tensor,
    vocab_size: int,
    loss_mask: Tensor,
    lengths: Tensor,
    d2t: Tensor,
    decay: float,
    drop_out_of_vocab: bool = False,
    loss: str = "forward_kl",
    input_ids: Tensor | None = None,
) -> StepStats:
    """``loss`` (``draft.loss``, default forward KL: soft CE) to the target distribution
    restricted to the draft vocab, computed in chunks of slots (``vocab_loss``).

    ``hidden[k]`` (N_k, H): step k's final-normed hidden state at its supervised slots only,
    those of ``supervised_slots(loss_mask, lengths, K)[k]`` in row-major order (the draft's
    ``head_at``), so no head compute goes to prompt or padding slots; ``head_weight``
    (Vd, H) the draft's head. ``target``: the target's head over the draft vocabulary's
    tokens (in draft order) and its final hidden states; ``target_greedy`` (B, T): the
    target's argmax over its whole vocabulary of ``vocab_size`` tokens (what greedy
    verification accepts). ``input_ids`` (B, T): the labels of ``hard_ce``.

    ``drop_out_of_vocab``: slots whose target argmax is outside the draft vocabulary (the
    draft can never propose it, so they can never be accepted) carry no loss; they still
    count in the metrics, which measure what serving would accept. With ``hard_ce`` a slot
    whose label is outside the draft vocabulary carries no loss either."""
    vd = head_weight.shape[0]
    draft_to_target = torch.arange(vd, device=d2t.device) + d2t  # (Vd,) target ids
    weights = step_weights(len(hidden), decay)
    masks = supervised_slots(loss_mask, lengths, len(hidden))
    in_vocab = (
        in_draft_vocab(target_greedy, draft_to_target, vocab_size) if drop_out_of_vocab else None
    )
    to_draft = None
    if loss == "hard_ce":
        assert input_ids is not None, "hard_ce reads the labels from input_ids"
        to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device=d2t.device)
        to_draft[draft_to_target] = torch.arange(vd, device=d2t.device)
    rows, positions, row_weights, labels, trained_steps = [], [], [], [], []
    for k, mask in enumerate(masks):
        r, slots = mask.nonzero(as_tuple=True)  # row-major, as the draft's head_at
        pos = slots + 1 + k  # the target at t+1+k predicts x_{t+2+k}
        trained = torch.ones_like(r, dtype=torch.bool)
        if in_vocab is not None:
            trained = trained & in_vocab[r, pos]
        if to_draft is not None:
            assert input_ids is not None
            labels.append(to_draft[input_ids[r, pos + 1]])
            trained = trained & (labels[-1] >= 0)
        row_weights.append(trained.float() * weights[k] / trained.sum().clamp(min=1))
        rows.append(r)
        positions.append(pos)
        trained_steps.append(trained)
    out = vocab_loss(
        torch.cat(hidden),
        head_weight,
        torch.cat(row_weights),
        loss,
        target.rows(torch.cat(rows), torch.cat(positions)),
        torch.cat(labels) if labels else None,
    )
    step_losses, correct = [], []
    start = 0
    for k, mask in enumerate(masks):
        stop = start + len(rows[k])
        trained = trained_steps[k]
        per_slot = out.per_row[start:stop]
        step_losses.append(float((per_slot * trained).sum() / trained.sum().clamp(min=1)))
        right = torch.zeros_like(mask)
        drafted = draft_to_target[out.draft_argmax[start:stop]]
        right[mask] = drafted == target_greedy[rows[k], positions[k]]
        correct.append(right)
        start = stop
    return StepStats(loss=out.loss, step_losses=step_losses, correct=correct, valid=masks)


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
