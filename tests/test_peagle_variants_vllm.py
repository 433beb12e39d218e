"""P-EAGLE with EAGLE-3.1's norms before fc end to end in real vLLM: prepare (regenerated) ->
train -> export -> serve with parallel drafting, on the tiny llama target. vLLM serves it with
its EAGLE-3 loader (``llama_eagle3.py`` builds ``input_norm`` and ``fc_norm`` from the config
switches, and its proposer passes ``mask_hidden`` through ``combine_hidden_states``). Greedy
output with the drafter equals the target alone (fp32 target); the trained drafter keeps 90% of
the acceptance length measured on the unmutated code (vllm_e2e.FLOOR_FRACTION); and the
project's offline estimate on the same prompts agrees with vLLM's counters within 0.05, the
tolerance of test_eagle1_peagle_vllm.py and test_eagle3_variants_vllm.py, for the same reason
(both run the same fp32 weights; only a near-tie argmax flip can move a cycle). A drafter
whose mask_hidden skipped the norms, or whose norms were not exported, serves a different
drafter than the offline estimate measures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from vllm_e2e import FLOOR_FRACTION, held_out_prompts, serve, train_and_export

from eagle_train.checkpoint import load_draft_checkpoint
from eagle_train.data.loader import PreparedData
from eagle_train.drafts.registry import get_draft
from eagle_train.evaluate.offline import estimate_acceptance
from eagle_train.target import FrozenTarget
from eagle_train.train_setup import draft_vocab

pytestmark = pytest.mark.vllm
K = 3
# vLLM AL of the trained drafter, measured 2026-12-01 on 2 shared CPU cores (this file run
# once, unmutated; the offline estimate was 1.923 too).
MEASURED = 1.923


def test_peagle_eagle31_served_in_vllm(tiny_world: Path, tmp_path: Path) -> None:
    overrides = [
        "train.max_steps=100",
        f"draft.parallel_steps={K}",
        "draft.norm_before_fc=true",
        "draft.fc_norm=true",
    ]
    trained = train_and_export(tiny_world, "llama", tmp_path, "peagle", overrides)
    config = json.loads((trained["drafter"] / "config.json").read_text())
    assert config["norm_before_fc"] is True and config["fc_norm"] is True
    fp32_target = tiny_world / "targets" / "llama" / "fp32"
    prompts = held_out_prompts(tiny_world, "llama")
    baseline, _ = serve(fp32_target, prompts, None)
    with_draft, al_trained = serve(fp32_target, prompts, trained["drafter"], K)
    assert with_draft == baseline  # speculative decoding is lossless under greedy

    cfg, state, _ = load_draft_checkpoint(trained["checkpoint"])
    spec = get_draft(cfg.draft.algorithm)
    target = FrozenTarget.from_pretrained(fp32_target, dtype=torch.float32)
    vocab = draft_vocab(cfg, PreparedData(cfg.data.train), target.description.vocab_size)
    draft = spec.build(cfg.draft, target, vocab)
    assert draft.input_norm is not None and draft.fc_norm is not None
    draft.load_state_dict(state)  # the bf16 weights vLLM serves, upcast like vLLM does
    offline = estimate_acceptance(spec, draft.eval(), cfg.draft, target, prompts, baseline, K)
    print(f"P-EAGLE 3.1: vLLM AL {al_trained:.3f}, offline {offline.acceptance_length:.3f}")
    assert abs(offline.acceptance_length - al_trained) <= 0.05
    assert al_trained >= FLOOR_FRACTION * MEASURED, (al_trained, FLOOR_FRACTION * MEASURED)
