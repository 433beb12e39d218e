"""The RoPE position of every drafted slot equals the one vLLM gives that slot, read off the
rotary calls of each draft during a real training loss. Hand reference from vLLM 0.32's
proposers (vllm/v1/spec_decode/):

- EAGLE-1/-3 (``llm_base_proposer.py``): the first pass feeds the shifted tokens at the
  target's positions (``copy_and_expand_eagle_inputs_kernel``: "positions are NOT shifted"),
  so slot t (token x_{t+1}) sits at t; every later step adds one
  (``eagle_step_update_slot_mapping_and_metadata``: new_position = position + 1). TTT step k
  at slot t: position t + k.
- P-EAGLE (parallel drafting, the same kernel): output j at start_pos + j, the bonus token at
  the anchor's position and the mask slots after it. Element (anchor a, depth d): a + d.
- DFlash (``dflash.py``, ``copy_and_expand_dflash_inputs_kernel``): context keys at the
  target's positions, query slot i at last_context_pos + 1 + i. A block anchored at a (context
  0..a-1): slots a .. a+B-1, context 0..T-1 (each block attends only context < a).
"""

from __future__ import annotations

import torch
from demo_drafts import VOCAB, demo_draft

from eagle_train.data.loader import Batch

T = 40


def _run(algorithm: str, family: str = "llama"):
    """(config, draft, recorded rotary positions per call, recorded forward args) of one loss."""
    cfg, spec, target, draft = demo_draft(algorithm, family)
    calls: list[torch.Tensor] = []
    inputs: list[tuple] = []
    rotary_forward, draft_forward = draft.rotary.forward, draft.forward

    def rotary(x, positions):
        calls.append(positions.detach().clone())
        return rotary_forward(x, positions)

    def forward(*args, **kwargs):
        inputs.append(args)
        return draft_forward(*args, **kwargs)

    draft.rotary.forward, draft.forward = rotary, forward
    ids = torch.randint(4, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([T, T - 4]))
    features = target.features(ids, None, spec.target_layer_ids(cfg.draft, target.description))
    torch.manual_seed(2)
    spec.compute_loss(draft, features, batch, cfg.draft).loss.backward()
    return cfg, draft, calls, inputs


def test_eagle3_ttt_step_k_sits_at_t_plus_k() -> None:
    cfg, _, calls, _ = _run("eagle3")
    steps = cfg.draft.ttt_steps
    assert steps >= 2  # the demo config trains several steps: k > 0 is exercised
    slots = torch.arange(T).expand(2, T)
    assert len(calls) == steps
    for k, positions in enumerate(calls):
        assert torch.equal(positions, slots + k), f"TTT step {k}"


def test_eagle1_chained_step_k_sits_at_t_plus_k() -> None:
    """EAGLE-1 trains one step (slot t at t); chained (as the offline estimate and vLLM
    chain it) step k sits at t + k."""
    _, draft, calls, inputs = _run("eagle1")
    slots = torch.arange(T).expand(2, T)
    assert len(calls) == 1 and torch.equal(calls[0], slots)
    feature, ids = inputs[0][0], inputs[0][1]
    calls.clear()
    draft(feature.detach(), ids, num_steps=3)
    assert [c.tolist() for c in calls] == [(slots + k).tolist() for k in range(3)]


def test_peagle_depth_d_sits_at_anchor_plus_d() -> None:
    _, _, calls, inputs = _run("peagle")
    assert len(calls) == len(inputs) >= 1
    for positions, (_, _, elements) in zip(calls, inputs, strict=True):
        assert (elements.depth > 0).any()  # deep elements are exercised
        want = elements.anchor + elements.depth
        valid = elements.valid
        assert torch.equal(positions[valid], want[valid])


def test_dflash_block_slots_sit_at_anchor_onwards() -> None:
    cfg, _, calls, inputs = _run("dflash")
    block = cfg.draft.block_size
    assert len(calls) == 2 and len(inputs) == 1
    context, blocks = calls
    (_, _, anchors) = inputs[0]
    assert torch.equal(context, torch.arange(T).expand(2, T))
    want = (anchors[..., None] + torch.arange(block)).reshape(2, -1)
    assert torch.equal(blocks, want)
    assert (anchors > 0).any()
