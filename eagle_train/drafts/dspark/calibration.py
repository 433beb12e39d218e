"""The confidence head against the acceptance it estimates: the offline replay of greedy
speculative decoding (``evaluate/offline.py``'s cycles) with, at every cycle, the head's
estimate for each drafted position beside whether that position was accepted.

The head estimates position k's acceptance given positions < k were accepted (its input is
the previous token's Markov embedding, the drafted token only when that one was right), so
each position is scored over the cycles that reached it: predicted = the mean estimate
there, observed = the fraction accepted there."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_train.drafts.dspark.config import DSparkConfig
from eagle_train.drafts.dspark.model import DSparkDraft
from eagle_train.drafts.dspark.spec import DSparkSpec
from eagle_train.target_model import FrozenTarget


@dataclass
class CalibrationRow:
    position: int  # 0-based drafted position in the block
    reached: int  # cycles whose positions < position were all accepted
    accepted: int  # of those, cycles that accepted this position too
    predicted: float  # the confidence head's mean estimate over the reaching cycles

    @property
    def observed(self) -> float:
        return self.accepted / self.reached if self.reached else 0.0


def chain_lengths(proposals: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
    """(T,) accepted run at each slot: ``proposals[t, k]`` guesses ``sequence[t + 2 + k]``."""
    length, k_max = proposals.shape
    padded = torch.cat([sequence, sequence.new_full((k_max + 2,), -1)])
    truth = padded[torch.arange(length)[:, None] + 2 + torch.arange(k_max)]
    return (proposals == truth).long().cumprod(-1).sum(-1)


def cycle_slots(
    chains: torch.Tensor, prompt_len: int, num_new: int, k_max: int
) -> list[tuple[int, int, bool]]:
    """(slot, accepted, rejected) of every cycle greedy speculative decoding runs over
    ``num_new`` generated tokens (the walk of ``drafts/cycles.replay_positions``): rejected
    is whether position ``accepted`` was drafted and refused (not when the block was all
    accepted, nor when the generation's end cut the cycle short)."""
    slot, generated, out = prompt_len - 1, 1, []
    while generated < num_new:
        run = min(int(chains[slot]), k_max)
        n = min(run, num_new - generated)
        out.append((slot, n, n == run and run < k_max))
        generated += n + 1
        slot += n + 1
    return out


@torch.no_grad()
def calibration_table(
    spec: DSparkSpec,
    draft: DSparkDraft,
    cfg: DSparkConfig,
    target: FrozenTarget,
    prompts: list[list[int]],
    outputs: list[list[int]],
    num_steps: int,
) -> list[CalibrationRow]:
    """Per drafted position: cycles reaching it, accepting it, and the mean estimate."""
    if draft.confidence_head is None:
        raise ValueError("this DSpark draft has no confidence head (draft.confidence_head)")
    layer_ids = spec.target_layer_ids(cfg, target.description)
    reached, accepted = [0] * num_steps, [0] * num_steps
    predicted = [0.0] * num_steps
    for prompt, output in zip(prompts, outputs, strict=True):
        seq = torch.tensor([prompt + output])
        features = target.features(seq, None, layer_ids)
        ids, conf = spec.block_outputs(draft, features, seq, num_steps)
        chains = chain_lengths(ids[0].cpu(), seq[0])
        for slot, n, rejected in cycle_slots(chains, len(prompt), len(output), num_steps):
            for k in range(n + 1 if rejected else n):
                reached[k] += 1
                accepted[k] += int(k < n)
                predicted[k] += float(conf[0, slot, k])
    return [
        CalibrationRow(k, reached[k], accepted[k], predicted[k] / reached[k] if reached[k] else 0.0)
        for k in range(num_steps)
    ]


def format_table(rows: list[CalibrationRow]) -> str:
    """A markdown table: position, cycles reaching it, predicted vs observed acceptance."""
    lines = [
        "| position | cycles reaching it | predicted (confidence head) | observed |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.position + 1} | {r.reached} | {r.predicted:.3f} | {r.observed:.3f} |" for r in rows
    ]
    return "\n".join(lines)
