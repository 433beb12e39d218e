"""Acceptance as vLLM counts it: per draft cycle, from the statistics a loss already has.

``sim_accept_len`` averages the accepted chain over EVERY supervised slot. vLLM's acceptance
length is per cycle: greedy speculative decoding drafts once after the prompt (whose
prefill yields the first token) and then advances by accepted + 1 (the bonus token), so
cycles start only at some slots. Easy stretches, where chains are long, are crossed in few
cycles and hard ones in many, so the per-cycle figure is lower than the per-slot one on any
real text. ``cycle_accept_len`` replays those cycles from the start of every assistant turn
of a batch, on the per-step correct/valid masks a loss computed anyway (teacher-forced
chains equal autoregressive drafting as long as the proposals are right, which is all that
acceptance counts): it is what vLLM would count if it generated exactly those tokens.

Metrics are combined over micro-batches as means weighted by supervised slots, so a batch
reports its cycle counts divided by its weight (``cycle_drafts``, ``cycle_accepted_k``) and
``finish_cycle_metrics`` turns the pooled means into ratios once the batches are combined.
"""

from __future__ import annotations

import torch
from torch import Tensor

DRAFTS, ACCEPTED = "cycle_drafts", "cycle_accepted_"


def replay_positions(
    chains: Tensor, prompt_len: int, num_new: int, k_max: int
) -> tuple[int, list[int]]:
    """(drafts, accepted tokens at each of the k_max positions), as vLLM's counters count,
    for ``num_new`` tokens generated after ``prompt_len``; ``chains[t]`` is the accepted run
    of a cycle drafting at slot t (its proposals guess tokens t + 2, t + 3, ...).

    The last cycle may end on accepted tokens alone: when the final accepted token is the
    stop (eos or the length limit) the bonus token is dropped, but vLLM still counts the
    accepted ones.
    """
    slot, generated, drafts = prompt_len - 1, 1, 0  # prefill yields 1 token
    per_position = [0] * k_max
    while generated < num_new:
        n = min(int(chains[slot]), k_max, num_new - generated)
        drafts += 1
        for k in range(n):
            per_position[k] += 1
        generated += n + 1
        slot += n + 1
    return drafts, per_position


def turn_spans(loss_mask: Tensor, length: int) -> list[tuple[int, int]]:
    """(start, end) of every run of supervised tokens in one row's first ``length`` tokens
    that follows a prompt: each is one assistant turn the engine would generate."""
    mask = loss_mask[:length].tolist()
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            if start > 0:
                spans.append((start, i))
            start = None
    return spans


def step_chains(correct: list[Tensor], valid: list[Tensor]) -> Tensor:
    """(B, T) accepted run at each slot: how many leading steps are right and supervised."""
    right = torch.stack([c & v for c, v in zip(correct, valid, strict=True)], dim=-1)
    return right.long().cumprod(dim=-1).sum(dim=-1)


def cycle_counts(
    correct: list[Tensor], valid: list[Tensor], loss_mask: Tensor, lengths: Tensor
) -> tuple[int, list[int]]:
    """(drafts, accepted at each position) of the replayed cycles of every turn of a batch."""
    k_max = len(correct)
    chains = step_chains(correct, valid).cpu()
    mask, lens = loss_mask.cpu(), lengths.cpu()
    drafts, accepted = 0, [0] * k_max
    for b in range(chains.shape[0]):
        for start, end in turn_spans(mask[b], int(lens[b])):
            d, per_position = replay_positions(chains[b], start, end - start, k_max)
            drafts += d
            accepted = [a + p for a, p in zip(accepted, per_position, strict=True)]
    return drafts, accepted


def cycle_metrics(
    correct: list[Tensor], valid: list[Tensor], loss_mask: Tensor, lengths: Tensor
) -> dict[str, float]:
    """A batch's cycle counts divided by its weight (its supervised slots, ``valid[0]``)."""
    weight = int(valid[0].sum())
    drafts, accepted = cycle_counts(correct, valid, loss_mask, lengths)
    scale = 1.0 / weight if weight else 0.0
    out = {DRAFTS: drafts * scale}
    out.update({f"{ACCEPTED}{k}": a * scale for k, a in enumerate(accepted)})
    return out


def finish_cycle_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Combined metrics with the weighted cycle counts replaced by ``cycle_accept_len``
    (1 + accepted / drafts, pooled over the batches) and ``cycle_acc_k`` (the fraction of
    cycles whose draft k was accepted, vLLM's per-position acceptance rate)."""
    if DRAFTS not in metrics:
        return metrics
    out = {k: v for k, v in metrics.items() if k != DRAFTS and not k.startswith(ACCEPTED)}
    drafts = metrics[DRAFTS]
    steps = sorted(int(k[len(ACCEPTED) :]) for k in metrics if k.startswith(ACCEPTED))
    accepted = [metrics[f"{ACCEPTED}{k}"] for k in steps]
    if drafts > 0:
        out["cycle_accept_len"] = 1.0 + sum(accepted) / drafts
        out.update({f"cycle_acc_{k}": a / drafts for k, a in enumerate(accepted)})
    return out
