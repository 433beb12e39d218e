"""The project's own acceptance estimate: replay vLLM's draft-verify cycles on a sequence.

Given the target's greedy continuation of a prompt, the draft's chained proposals at every
slot (``spec.propose``, teacher-forced: identical to autoregressive drafting as long as the
proposals are right, which is all that acceptance counts) give the accepted length of a
cycle starting there. Cycles start after the prompt and advance by accepted + 1 (the bonus
token), exactly as greedy speculative decoding does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.cycles import replay_positions
from eagle_train.target_model import FrozenTarget


@dataclass
class OfflineAcceptance:
    drafts: int
    accepted: int
    # Per prompt, as vLLM counts one request: (drafts, accepted tokens at each position).
    per_request: list[tuple[int, list[int]]] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0


def chain_lengths(proposals: Tensor, sequence: Tensor) -> Tensor:
    """(T,) accepted run at each slot: proposals[t, k] predicts sequence[t + 2 + k]."""
    length, k_max = proposals.shape
    out = torch.zeros(length, dtype=torch.long)
    for t in range(length):
        n = 0
        while n < k_max and t + 2 + n < len(sequence) and proposals[t, n] == sequence[t + 2 + n]:
            n += 1
        out[t] = n
    return out


def replay_cycles(chains: Tensor, prompt_len: int, num_new: int, k_max: int) -> tuple[int, int]:
    """(drafts, accepted) of greedy speculative decoding over ``num_new`` generated tokens."""
    drafts, per_position = replay_positions(chains, prompt_len, num_new, k_max)
    return drafts, sum(per_position)


@torch.no_grad()
def estimate_acceptance(
    spec: DraftSpec,
    draft: torch.nn.Module,
    cfg: object,
    target: FrozenTarget,
    prompts: list[list[int]],
    outputs: list[list[int]],
    num_steps: int,
) -> OfflineAcceptance:
    layer_ids = spec.target_layer_ids(cfg, target.description)
    total = OfflineAcceptance(0, 0)
    for prompt, output in zip(prompts, outputs, strict=True):
        seq = torch.tensor([prompt + output])
        features = target.features(seq, None, layer_ids)
        proposals = spec.propose(draft, features, seq, cfg, num_steps)[0].cpu()
        chains = chain_lengths(proposals, seq[0])
        drafts, per_position = replay_positions(chains, len(prompt), len(output), num_steps)
        total.drafts += drafts
        total.accepted += sum(per_position)
        total.per_request.append((drafts, per_position))
    return total
