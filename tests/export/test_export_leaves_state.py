"""An export leaves the state it was given unchanged: the acceptance probe exports the live
draft's tensors (``detach().cpu()`` on the CPU shares their storage), so an export that casts
or edits a tensor in place would change the draft being trained. Every algorithm, exported
in the target's bf16 from an fp32 draft whose every weight differs from its initialisation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from draft_cases import ALGORITHMS
from run_configs import run_config, target_path

from eagle_train.drafts.registry import get_draft
from eagle_train.export import export_state
from eagle_train.target_model import FrozenTarget


@pytest.fixture(scope="module")
def target(tiny_world: Path) -> FrozenTarget:
    return FrozenTarget.from_pretrained(target_path(tiny_world, "llama", "fp32"), torch.float32)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_export_leaves_the_given_state_unchanged(
    algorithm: str, tiny_world: Path, target: FrozenTarget, tmp_path: Path
) -> None:
    cfg = run_config(tiny_world, "unused", tmp_path / "run", algo=algorithm)
    assert cfg.target.dtype == "bfloat16"  # the export casts: fp32 state, bf16 files
    spec = get_draft(algorithm)
    torch.manual_seed(0)
    draft = spec.build(cfg.draft, target, None)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.1 * torch.randn_like(p))
    state = {k: v.detach().cpu() for k, v in draft.state_dict().items()}  # as the probe does
    before = {k: v.clone() for k, v in state.items()}
    export_state(state, cfg, tmp_path / "drafter", {"step": 0})
    assert state.keys() == before.keys()
    changed = [k for k in state if not torch.equal(state[k], before[k])]
    assert changed == [], f"the export changed {changed}"
    live = dict(draft.state_dict())
    assert all(torch.equal(live[k], before[k]) for k in live)
