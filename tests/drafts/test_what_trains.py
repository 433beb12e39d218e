"""What trains, by name: for each algorithm, the exact parameters that move after one real
optimizer step (the project's optimizer on the project's loss), and the exact ones that must
stay put (the draft's frozen copies of the target's embedding / head, and every target
weight), written out here by hand from docs/algorithms/, never derived from ``requires_grad``."""

from __future__ import annotations

import pytest
import torch
from demo_drafts import VOCAB, demo_draft
from draft_cases import ALGORITHMS

from eagle_train.data.loader import Batch
from eagle_train.optim import create_optimizer

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def layer(i: int, *, input_norm: bool, hidden_norm: bool = False, qk_norm: bool) -> set[str]:
    """The names of decoder layer ``i``'s weights (vLLM's names)."""
    p = f"layers.{i}."
    names = {p + f"self_attn.{n}.weight" for n in PROJ} | {p + f"mlp.{n}.weight" for n in MLP}
    names.add(p + "post_attention_layernorm.weight")
    names |= {p + "input_layernorm.weight"} if input_norm else set()
    names |= {p + "hidden_norm.weight"} if hidden_norm else set()
    names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"} if qk_norm else set()
    return names


def trains(algorithm: str, qwen3: bool) -> set[str]:
    """What the demo config of ``algorithm`` trains (one draft layer; P-EAGLE two)."""
    if algorithm == "eagle1":  # fc + plain layers, layer 0 without input norm, no final norm
        return {"fc.weight"} | layer(0, input_norm=False, qk_norm=False)
    fused = {"fc.weight", "norm.weight", "lm_head.weight"}
    fused |= layer(0, input_norm=True, hidden_norm=True, qk_norm=qwen3)
    if algorithm == "eagle3":
        return fused
    if algorithm == "peagle":  # + the mask token's embedding row and hidden, a second layer
        return fused | {"mask_embedding", "mask_hidden"} | layer(1, input_norm=True, qk_norm=qwen3)
    backbone = {"fc.weight", "hidden_norm.weight", "norm.weight"} | layer(
        0, input_norm=True, qk_norm=True
    )
    if algorithm == "dspark":  # DFlash's backbone + the Markov and confidence heads
        heads = {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}
        return backbone | heads | {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    assert algorithm == "dflash"  # fc, its hidden norm, Qwen3-style layers, final norm
    return backbone


# The draft's own frozen copies of target weights (DFlash borrows the target's modules: it
# has none of its own, and the target check below covers them).
FROZEN = {
    "eagle1": {"embed_tokens.weight", "lm_head.weight"},
    "eagle3": {"embed_tokens.weight"},
    "peagle": {"embed_tokens.weight"},  # only the mask row trains, as mask_embedding
    "dflash": set(),
    "dspark": set(),  # DFlash's borrowing: the target's embedding and head, no copies
}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_step_moves_exactly_the_trained_parameters(algorithm: str, family: str) -> None:
    sets = ["optim.lr=1e-2", "optim.warmup_steps=0"]
    sets.append("optim.implementation=fused")  # no torch.compile in a fast test
    cfg, spec, target, draft = demo_draft(algorithm, family, tuple(sets))
    target_before = {n: p.detach().clone() for n, p in target.model.named_parameters()}
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}

    optimizer = create_optimizer(draft, cfg.optim)
    ids = torch.randint(4, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([40, 36]))
    features = target.features(ids, None, spec.target_layer_ids(cfg.draft, target.description))
    torch.manual_seed(2)
    spec.compute_loss(draft, features, batch, cfg.draft).loss.backward()
    optimizer.step()

    after = dict(draft.named_parameters())
    moved = {n for n, p in after.items() if not torch.equal(p.detach(), before[n])}
    assert moved == trains(algorithm, family == "qwen3")
    assert set(after) - moved == FROZEN[algorithm]
    # the frozen copies are the target's weights, and no target weight moved or got a gradient
    embed, head = target.embed_tokens().weight, target.lm_head().weight
    if "embed_tokens.weight" in FROZEN[algorithm]:
        assert torch.equal(after["embed_tokens.weight"].detach(), embed.detach().float())
    if "lm_head.weight" in FROZEN[algorithm]:
        assert torch.equal(after["lm_head.weight"].detach(), head.detach().float())
    for name, p in target.model.named_parameters():
        assert torch.equal(p.detach(), target_before[name]), f"target weight {name} moved"
        assert p.grad is None or not p.grad.any(), f"target weight {name} got a gradient"
