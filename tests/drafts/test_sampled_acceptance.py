"""The offline acceptance length at a serving temperature (drafts/sampled_acceptance.py),
checked against a brute-force replay of vLLM's verification written here, against vLLM's own
top-k/top-p code, and against each draft's greedy estimate in the temperature-0 limit."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from realistic import random_ids
from run_configs import target_path
from torch import nn

from eagle_train.data.loader import Batch
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.registry import get_draft
from eagle_train.drafts.sampled_acceptance import (
    sampled_acceptance_metrics,
    sampled_estimate,
    serving_probs,
)
from eagle_train.target_model import FrozenTarget, TargetFeatures

# A tiny world over 4 tokens: the target's next-token logits depend on the current token
# only (row = current token), and the draft proposes a fixed next token for each token.
TARGET_LOGITS = [
    [1.0, 0.2, -0.5, 0.3],
    [0.1, 0.9, 1.4, -1.0],
    [2.0, -0.3, 0.0, 0.4],
    [-0.2, 0.5, 0.1, 1.1],
]
DRAFT_NEXT = {0: 2, 1: 0, 2: 3, 3: 1}  # vLLM's default draft: its argmax, not a sample


def brute_distribution(
    row: list[float], temperature: float, top_p: float, top_k: int | None
) -> list[float]:
    """The target's sampling distribution, by hand: softmax(l / T) over the top_k tokens,
    then the most likely tokens until their mass reaches top_p."""
    ranked = sorted(range(len(row)), key=lambda x: -row[x])
    kept = ranked[:top_k] if top_k else ranked
    weights = {x: math.exp(row[x] / temperature) for x in kept}
    total = sum(weights.values())
    probs = {x: w / total for x, w in weights.items()}
    nucleus, mass = [], 0.0
    for x in sorted(probs, key=lambda x: -probs[x]):
        if mass >= top_p:
            break
        nucleus.append(x)
        mass += probs[x]
    norm = sum(probs[x] for x in nucleus)
    return [probs[x] / norm if x in nucleus else 0.0 for x in range(len(row))]


def brute_expected_accepted(last: int, k_max: int, sampling: tuple) -> list[float]:
    """P(draft steps 0..k all accepted) for a cycle whose last accepted token is ``last``,
    by enumerating every accept/reject outcome of the K verifications: the draft chains on
    its own proposals, and vLLM accepts a proposal x with probability min(1, p(x) / q(x)),
    q = 1 (no draft probabilities), p the target's distribution in the draft's context."""
    drafted, prev = [], last
    for _ in range(k_max):
        drafted.append(DRAFT_NEXT[prev])
        prev = drafted[-1]
    contexts = [last, *drafted[:-1]]
    accept = [
        min(1.0, brute_distribution(TARGET_LOGITS[c], *sampling)[x] / 1.0)
        for c, x in zip(contexts, drafted, strict=True)
    ]
    prefix = [0.0] * k_max
    for outcome in itertools.product([True, False], repeat=k_max):
        weight = math.prod(a if ok else 1 - a for a, ok in zip(accept, outcome, strict=True))
        for k in range(k_max):
            if all(outcome[: k + 1]):  # a rejection ends the cycle
                prefix[k] += weight
    return prefix


class ChainSpec:
    """A draft spec whose teacher-forced proposal for x_{t+2+k} is DRAFT_NEXT of the true
    x_{t+1+k}."""

    def propose(self, draft, features, input_ids, cfg, num_steps):
        b, t = input_ids.shape
        out = torch.zeros(b, t, num_steps, dtype=torch.long)
        for i, k in itertools.product(range(t), range(num_steps)):
            out[:, i, k] = torch.tensor(
                [DRAFT_NEXT[int(row[min(i + 1 + k, t - 1)])] for row in input_ids]
            )
        return out


@pytest.mark.parametrize(
    "sampling", [(1.0, 1.0, None), (0.6, 1.0, None), (1.0, 0.8, None), (0.8, 0.9, 2)]
)
def test_sampled_estimate_equals_a_brute_force_replay(sampling: tuple) -> None:
    k_max, length = 3, 10
    # The data follows the draft's own chain (so teacher-forced contexts are the serving
    # ones), then a token the draft would not have proposed; row 2 is shorter.
    seq = [1]
    while len(seq) < length:
        seq.append(DRAFT_NEXT[seq[-1]])
    other = [3, 1, 0, 2, 2, 0, 3, 1, 0, 0]
    ids = torch.tensor([seq, other])
    loss_mask = torch.ones_like(ids)
    loss_mask[1, 4] = 0  # x_4 of row 1 is not an assistant token
    lengths = torch.tensor([length, 8])
    logits = torch.tensor(TARGET_LOGITS)[ids]  # position i predicts x_{i+1}
    # the head is the identity: the target's logits are these
    features = TargetFeatures(aux=torch.zeros(2, length, 1), final=logits, head=nn.Identity())
    batch = Batch(ids, loss_mask, torch.ones_like(ids), lengths)
    got = sampled_acceptance_metrics(ChainSpec(), None, features, batch, None, k_max, sampling)

    # Row 0 is exact (its contexts are the draft's own). Row 1's later steps condition on
    # the data's tokens, which is what the estimate replays, so the reference does too.
    expected = 1.0
    for k in range(k_max):
        terms = []
        for r in range(2):
            for t in range(length):
                pos = t + 2 + k
                if pos >= int(lengths[r]) or not loss_mask[r, pos]:
                    continue
                if r == 0:
                    terms.append(brute_expected_accepted(seq[t + 1], k_max, sampling)[k])
                else:
                    row = ids[1].tolist()
                    terms.append(
                        math.prod(
                            brute_distribution(TARGET_LOGITS[row[t + 1 + j]], *sampling)[
                                DRAFT_NEXT[row[t + 1 + j]]
                            ]
                            for j in range(k + 1)
                        )
                    )
        expected += sum(terms) / len(terms)
    assert got["sim_accept_len_sampled"] == pytest.approx(expected, rel=1e-5)
    assert 1.0 < got["sim_accept_len_sampled"] < k_max + 1


def test_serving_distribution_is_vllms() -> None:
    topk_topp = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    for temperature, top_p, top_k in [(1.0, 1.0, None), (0.7, 0.9, None), (1.3, 0.5, 7)]:
        k = None if top_k is None else torch.full((6,), top_k)
        p = None if top_p == 1.0 else torch.full((6,), top_p)
        ref = topk_topp.apply_top_k_top_p_pytorch(logits.clone() / temperature, k, p)
        assert torch.allclose(
            serving_probs(logits, temperature, top_p, top_k), ref.softmax(-1), atol=1e-6
        )


def test_greedy_limit_is_the_drafts_own_greedy_estimate(wide_world: Path) -> None:
    """At a temperature near 0 the target's distribution is one-hot at its argmax, so the
    sampled estimate over propose() must be EAGLE-3's own sim_accept_len (a misaligned
    position or step would break it), and at temperature 1 it is a different number."""
    path = target_path(wide_world, "llama", "fp32")
    target = FrozenTarget.from_pretrained(path, dtype=torch.float32)
    spec, cfg = get_draft("eagle3"), Eagle3Config(aux_layer_ids=[1, 2, 3], ttt_steps=3)
    torch.manual_seed(0)
    draft = spec.build(cfg, target, None)
    # The target's own greedy continuation of a prompt of ids its tokenizer produces (past
    # pad, bos and eos; none of the reserved ones, which no text holds).
    ids = random_ids(path, (2, 4), skip=3)
    with torch.no_grad():
        for _ in range(12):
            nxt = target.features(ids, None, [1]).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    mask = torch.ones_like(ids)
    mask[:, :4] = 0
    batch = Batch(ids, mask, torch.ones_like(ids), torch.tensor([16, 13]))
    features = target.features(ids, None, spec.target_layer_ids(cfg, target.description))
    # A few steps on the batch itself, so that the draft gets some tokens right (a random one
    # almost never picks the target's token among 33,024).
    opt = torch.optim.Adam(draft.parameters(), lr=1e-2)
    for _ in range(10):
        spec.compute_loss(draft, features, batch, cfg).loss.backward()
        opt.step()
        opt.zero_grad()
    draft.eval()
    with torch.no_grad():
        greedy = spec.compute_loss(draft, features, batch, cfg).metrics
    assert greedy["sim_accept_len"] > 1.0, greedy  # some chains accepted: a real comparison
    cold = SimpleNamespace(temperature=1e-4, top_p=1.0, top_k=None)
    near0 = sampled_estimate(spec, draft, features, batch, cfg, greedy, cold)
    assert near0["sim_accept_len_sampled"] == pytest.approx(greedy["sim_accept_len"], abs=1e-4)
    warm = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=None)
    at1 = sampled_estimate(spec, draft, features, batch, cfg, greedy, warm)
    assert 1.0 <= at1["sim_accept_len_sampled"] <= 4.0
    assert abs(at1["sim_accept_len_sampled"] - greedy["sim_accept_len"]) > 1e-3
    off = SimpleNamespace(temperature=0.0, top_p=1.0, top_k=None)
    assert sampled_estimate(spec, draft, features, batch, cfg, greedy, off) == {}


def test_validation_reports_the_sampled_estimate_beside_the_greedy_one(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
) -> None:
    """train.acceptance.temperature > 0: every validation record carries
    sim_accept_len_sampled (in [1, K+1]) next to sim_accept_len; at 0 it has none."""
    from train_runs import CONFIG, overrides
    from typer.testing import CliRunner

    from eagle_train.cli import train_draft_app
    from eagle_train.metrics import read_metrics

    for temperature, out in ((0.7, tmp_path / "hot"), (0.0, tmp_path / "greedy")):
        args = ["--config", str(CONFIG)]
        for o in [
            *overrides(tiny_world, tiny_llama_data, out, steps=6),
            f"train.acceptance.temperature={temperature}",
        ]:
            args += ["--set", o]
        result = CliRunner().invoke(train_draft_app, args)
        assert result.exit_code == 0, result.output
        val = read_metrics(out / "metrics.jsonl", "val")
        assert val and all("sim_accept_len" in r for r in val)
        if temperature:
            assert all(1.0 <= r["sim_accept_len_sampled"] <= 4.0 for r in val), val
        else:
            assert not any("sim_accept_len_sampled" in r for r in val)
