"""The offline acceptance replay: chains per slot and vLLM's draft/verify cycles."""

from __future__ import annotations

import torch

from eagle_train.evaluate.offline import chain_lengths, replay_cycles


def test_chain_lengths_count_the_correct_prefix() -> None:
    seq = torch.tensor([5, 6, 7, 8, 9, 10])
    # proposals[t, k] guesses seq[t + 2 + k]
    proposals = torch.tensor([[7, 8, 0], [8, 0, 10], [9, 10, 11], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert chain_lengths(proposals, seq).tolist() == [2, 1, 2, 0, 0, 0]


def test_replay_advances_by_accepted_plus_bonus() -> None:
    chains = torch.tensor([0, 0, 3, 1, 0, 2, 3, 0, 0, 0, 0, 0])
    # prompt of 3 tokens: first cycle at slot 2 accepts 3 (+1 bonus) -> slot 6 accepts 3
    # -> slot 10 accepts 0 ... until 10 new tokens exist.
    drafts, accepted = replay_cycles(chains, prompt_len=3, num_new=10, k_max=3)
    assert (drafts, accepted) == (3, 6)  # 1 (prefill) + 4 + 4 + 1 = 10
    drafts, accepted = replay_cycles(chains, prompt_len=3, num_new=10, k_max=2)
    assert (drafts, accepted) == (5, 4)  # slots 2 (+2), 5 (+2), 8, 9, 10: 1 + 3 + 3 + 1 + 1 + 1


def test_last_cycle_counts_accepted_tokens_without_a_bonus() -> None:
    chains = torch.tensor([0, 3, 3, 3, 3])
    # 1 token from prefill, then slot 1 may accept 3 but only 2 tokens remain: vLLM counts
    # the 2 accepted ones and drops the bonus at the stop.
    assert replay_cycles(chains, prompt_len=2, num_new=3, k_max=3) == (1, 2)


def test_per_position_counts_are_what_vllms_counters_count() -> None:
    from eagle_train.evaluate.offline import replay_positions

    # The same cycles as above with k_max=3: slot 2 accepts 3, slot 6 accepts 3, slot 10
    # accepts 0. vLLM's accepted_per_pos[k] counts the cycles whose draft k was accepted:
    # positions 0, 1 and 2 each accepted twice.
    chains = torch.tensor([0, 0, 3, 1, 0, 2, 3, 0, 0, 0, 0, 0])
    assert replay_positions(chains, prompt_len=3, num_new=10, k_max=3) == (3, [2, 2, 2])
    # k_max=2: slots 2 (+2), 5 (+2), 8, 9, 10 (+0 each): two cycles reach position 1.
    assert replay_positions(chains, prompt_len=3, num_new=10, k_max=2) == (5, [2, 2])
    # a cycle cut by the stop counts only the positions it reached: [1, 1, 0]
    assert replay_positions(torch.tensor([0, 3, 3, 3, 3]), 2, 3, 3) == (1, [1, 1, 0])
