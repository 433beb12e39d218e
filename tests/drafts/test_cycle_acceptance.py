"""``cycle_accept_len``: vLLM's draft cycles replayed on the correct/valid masks a loss already
computed (drafts/cycles.py), against cycles worked out by hand and against the offline
replay through the target and ``propose`` (evaluate/offline.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from realistic import random_ids
from run_configs import target_path

from eagle_train.data.loader import Batch
from eagle_train.drafts.cycles import cycle_counts, cycle_metrics, finish_cycle_metrics
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.registry import get_draft
from eagle_train.evaluate.offline import estimate_acceptance
from eagle_train.metrics import WeightedMean
from eagle_train.target_model import FrozenTarget

K = 3
# Row 0: a 3-token prompt, one 9-token answer. Row 1 (length 10, two padding slots): two
# turns, tokens 2-4 and 7-9.
MASKS = [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0]]
LENGTHS = [12, 10]
# Steps right at the slots where cycles start; every other slot is right at every step, so a
# replay starting or advancing at the wrong slot counts a different chain.
AT_CYCLES = {
    (0, 2): [1, 1, 0],  # chain 2: 1 + 3 = 4 tokens, next slot 5
    (0, 5): [1, 0, 1],  # chain 1 (step 2 right after a miss does not count): 6 tokens, slot 7
    (0, 7): [0, 1, 1],  # chain 0: 7 tokens, slot 8
    (0, 8): [1, 1, 1],  # token 12 is past the row: chain 2; 2 tokens were left anyway: done
    (1, 1): [1, 1, 1],  # token 5 is a user token: chain 2, which ends the 3-token turn
    (1, 6): [0, 1, 1],  # second turn: chain 0, slot 7
    (1, 7): [1, 1, 1],  # token 10 is padding: chain 1, the turn's last token
}
# drafts 4 + 1 + 2; accepted at position 0: 3 (row 0) + 1 + 1; position 1: 2 + 1 + 0.
DRAFTS, ACCEPTED = 7, [5, 3, 0]


def hand_made() -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
    mask, lengths = torch.tensor(MASKS), torch.tensor(LENGTHS)
    correct = [torch.ones(2, 12, dtype=torch.bool) for _ in range(K)]
    valid = [torch.zeros(2, 12, dtype=torch.bool) for _ in range(K)]
    for (b, t), steps in AT_CYCLES.items():
        for k in range(K):
            correct[k][b, t] = bool(steps[k])
    for b in range(2):
        for t in range(12):
            for k in range(K):
                pos = t + 2 + k
                valid[k][b, t] = pos < LENGTHS[b] and MASKS[b][pos] == 1
    return correct, valid, mask, lengths


def test_cycles_are_replayed_from_every_turn_start() -> None:
    assert cycle_counts(*hand_made()) == (DRAFTS, ACCEPTED)
    metrics = finish_cycle_metrics(cycle_metrics(*hand_made()))
    assert metrics["cycle_accept_len"] == pytest.approx(1 + 8 / 7)
    assert [metrics[f"cycle_acc_{k}"] for k in range(K)] == pytest.approx([5 / 7, 3 / 7, 0])
    assert not any(k.startswith("cycle_accepted") or k == "cycle_drafts" for k in metrics)


def test_batches_pool_cycles_not_their_ratios() -> None:
    """Row 0 alone: 4 drafts, 5 accepted; row 1 alone: 3 drafts, 3 accepted. Combined by
    supervised-slot weights as the loop combines metrics, the figure is 1 + 8/7, not a
    weighted mean of 1 + 5/4 and 1 + 3/3."""
    correct, valid, mask, lengths = hand_made()
    mean = WeightedMean()
    for b in range(2):
        rows = [c[b : b + 1] for c in correct], [v[b : b + 1] for v in valid]
        weight = int(rows[1][0].sum())
        mean.add(cycle_metrics(*rows, mask[b : b + 1], lengths[b : b + 1]), weight)
    assert finish_cycle_metrics(mean.result())["cycle_accept_len"] == pytest.approx(1 + 8 / 7)


def test_metrics_without_cycle_counts_pass_through() -> None:
    assert finish_cycle_metrics({"loss": 1.0}) == {"loss": 1.0}


def greedy_rows(target: FrozenTarget, prompts: torch.Tensor, new: int) -> torch.Tensor:
    ids = prompts
    with torch.no_grad():
        for _ in range(new):
            nxt = target.features(ids, None, [1]).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids


def test_trained_drafter_validation_figure_is_the_offline_replay(wide_world: Path) -> None:
    """On the target's own greedy answers, a trained tiny drafter's cycle_accept_len (from
    compute_loss, pooled as validation pools batches) equals estimate_acceptance's replay of
    the same rows, which runs the target and ``propose`` again."""
    target = FrozenTarget.from_pretrained(
        target_path(wide_world, "llama", "fp32"), dtype=torch.float32
    )
    spec, cfg = get_draft("eagle3"), Eagle3Config(aux_layer_ids=[1, 2, 3], ttt_steps=K)
    torch.manual_seed(0)
    draft = spec.build(cfg, target, None)
    layer_ids = spec.target_layer_ids(cfg, target.description)
    prompt_len = [6, 8, 7, 6]  # answers start after the random prefix: all greedy
    ids = greedy_rows(target, random_ids(target.model.name_or_path, (4, 6), skip=3), 30)
    lengths = torch.tensor([36, 30, 33, 25])
    mask = torch.zeros_like(ids)
    for b, (p, n) in enumerate(zip(prompt_len, lengths.tolist(), strict=True)):
        mask[b, p:n] = 1  # each row's answer: prompt_len to its length
    batches = [Batch(ids[i : i + 2], mask[i : i + 2], mask[i : i + 2], lengths[i : i + 2])
               for i in (0, 2)]  # fmt: skip
    feats = [target.features(b.input_ids, None, layer_ids) for b in batches]
    opt = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    for step in range(30):
        opt.zero_grad()
        spec.compute_loss(draft, feats[step % 2], batches[step % 2], cfg).loss.backward()
        opt.step()
    draft.eval()
    mean = WeightedMean()
    with torch.no_grad():
        for batch, features in zip(batches, feats, strict=True):
            result = spec.compute_loss(draft, features, batch, cfg)
            mean.add(result.metrics, result.weight)
    got = finish_cycle_metrics(mean.result())
    spans = list(zip(prompt_len, lengths.tolist(), strict=True))
    prompts = [ids[b, :p].tolist() for b, (p, _) in enumerate(spans)]
    outputs = [ids[b, p:n].tolist() for b, (p, n) in enumerate(spans)]
    offline = estimate_acceptance(spec, draft, cfg, target, prompts, outputs, K)
    assert offline.acceptance_length > 1.2, offline  # the drafter gets chains right
    assert got["cycle_accept_len"] == pytest.approx(offline.acceptance_length, abs=1e-9)
    per_position = [sum(r[1][k] for r in offline.per_request) for k in range(K)]
    expected = [a / offline.drafts for a in per_position]
    assert [got[f"cycle_acc_{k}"] for k in range(K)] == pytest.approx(expected, abs=1e-9)
    assert got["cycle_accept_len"] != pytest.approx(got["sim_accept_len"], abs=1e-6)
