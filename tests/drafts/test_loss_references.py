"""Losses and acceptance metrics against references written out by hand, index by index, with
K >= 3 (so a step's weight, its label offset and the joint-prefix rule all matter). Nothing
here calls the draft's own helpers to build the expected value."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from eagle_train.drafts.dflash.loss import dflash_loss
from eagle_train.drafts.eagle3.loss import StepStats, accuracy_metrics, eagle3_loss
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.evaluate.offline import OfflineAcceptance, replay_cycles

# 0.8^k for k = 0, 1, 2, normalised: 1, 0.8, 0.64 over 2.44.
EAGLE3_WEIGHTS_K3 = [1 / 2.44, 0.8 / 2.44, 0.64 / 2.44]


def test_eagle3_loss_k3_matches_a_hand_reference() -> None:
    torch.manual_seed(1)
    vocab, b, t = 9, 2, 9
    d2t = torch.tensor([0, 1, 1, 2, 4])  # draft ids 0..4 -> target ids 0, 2, 3, 5, 8
    ids = [0, 2, 3, 5, 8]
    target_logits = torch.randn(b, t, vocab)
    draft_logits = [torch.randn(b, t, len(ids)) for _ in range(3)]
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 0, 0]])
    lengths = torch.tensor([9, 7])
    greedy = target_logits.argmax(-1)
    # The loss reads step k's logits at its supervised slots only, in row-major order.
    supervised = [
        [
            (i, s)
            for i in range(b)
            for s in range(t)
            if s + 2 + k < lengths[i] and loss_mask[i, s + 2 + k] == 1
        ]
        for k in range(3)
    ]
    at_slots = [torch.stack([draft_logits[k][i, s] for i, s in supervised[k]]) for k in range(3)]
    # the logits themselves as hidden states through identity heads
    head, target = torch.eye(len(ids)), TargetHead(target_logits, torch.eye(vocab)[ids])
    stats = eagle3_loss(at_slots, head, target, greedy, vocab, loss_mask, lengths, d2t, 0.8)

    total = 0.0
    for k in range(3):
        terms = []
        for i in range(b):
            for s in range(t):
                label = s + 2 + k  # step k at slot s drafts x_{s+2+k}
                if label >= lengths[i] or loss_mask[i, label] == 0:
                    continue
                p = torch.softmax(target_logits[i, label - 1, ids], -1)  # target at s+1+k
                terms.append(-(p * torch.log_softmax(draft_logits[k][i, s], -1)).sum())
        step = torch.stack(terms).mean()
        assert stats.step_losses[k] == pytest.approx(step.item(), rel=1e-5)
        total += EAGLE3_WEIGHTS_K3[k] * step.item()
    assert stats.loss.item() == pytest.approx(total, rel=1e-5)


def test_simulated_acceptance_is_the_joint_prefix_rate() -> None:
    # 4 valid slots, K=3. Per slot, right/wrong at steps 0, 1, 2:
    #   slot 0: R R R   slot 1: R W R   slot 2: W R R   slot 3: R R W
    rows = [[1, 1, 1], [1, 0, 1], [0, 1, 1], [1, 1, 0]]
    correct = [torch.tensor([[bool(r[k]) for r in rows]]) for k in range(3)]
    valid = [torch.ones(1, 4, dtype=torch.bool)] * 3
    metrics = accuracy_metrics(StepStats(torch.zeros(()), [0.0] * 3, correct, valid))
    assert [metrics[f"acc_{k}"] for k in range(3)] == [0.75, 0.75, 0.75]
    # chains right through step 0: slots 0, 1, 3; through 1: 0, 3; through 2: 0.
    assert metrics["sim_accept_len"] == pytest.approx(1 + 3 / 4 + 2 / 4 + 1 / 4)


def test_dflash_loss_matches_a_hand_reference() -> None:
    torch.manual_seed(2)
    vocab, hidden_size, block = 7, 4, 4  # slots 1..3
    length = 10
    input_ids = torch.randint(0, vocab, (1, length))
    target_logits = torch.randn(1, length, vocab)
    anchors = torch.tensor([[1, 4, 8]])  # the last block runs past the end: not valid
    valid = torch.tensor([[True, True, False]])
    mask = valid[..., None].expand(1, 3, block - 1).clone()  # per-slot loss masks
    mask[0, 1, 2] = False  # block at 4: its last slot's label is not supervised
    hidden = torch.randn(1, 3, block - 1, hidden_size)
    head_weight = torch.randn(vocab, hidden_size)
    weights = torch.tensor([1.0, 0.5, 0.25])
    stats = dflash_loss(
        hidden,
        head_weight,
        input_ids,
        target_logits.argmax(-1),
        None,  # hard labels never read the target's logits
        anchors,
        mask,
        weights,
        "hard_ce",
    )
    num, den = 0.0, 0.0
    for n, a in enumerate([1, 4]):  # the valid blocks
        for k in (1, 2, 3) if a == 1 else (1, 2):  # slot k predicts x_{a+k}
            logits = hidden[0, n, k - 1] @ head_weight.T
            ce = F.cross_entropy(logits[None], input_ids[0, a + k][None]).item()
            num += weights[k - 1].item() * ce
            den += weights[k - 1].item()
    assert stats.loss.item() == pytest.approx(num / den, rel=1e-5)


def test_offline_replay_counts_the_bonus_token() -> None:
    # prompt of 3 tokens: the first cycle drafts after slot 2 (prefill gave 1 token).
    # Accepted runs per slot (K=3):
    chains = torch.tensor([0, 0, 2, 0, 0, 3, 0, 0, 0, 1, 0, 0])
    # cycle 1 at slot 2: 2 accepted + bonus -> 4 generated, next slot 5;
    # cycle 2 at slot 5: 3 accepted + bonus -> 8 generated = num_new: done.
    assert replay_cycles(chains, prompt_len=3, num_new=8, k_max=3) == (2, 5)
    assert OfflineAcceptance(drafts=2, accepted=5).acceptance_length == 3.5
