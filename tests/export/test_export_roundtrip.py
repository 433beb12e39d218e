"""Every export loads back into the project's own draft and computes what the draft it was
exported from computes. The export writes tensors under the draft's own parameter names
(vLLM's names are the draft's names), so loading is by name; a tensor written under another
tensor's name (k_proj and v_proj have the same shape) changes the forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO
from draft_cases import ALGORITHMS, loss_from_data
from export_cases import loss_of, perturbed_draft
from run_configs import target_path
from safetensors.torch import load_file

from eagle_train.config import load_config
from eagle_train.drafts.registry import get_draft
from eagle_train.export import export_state
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def family_target(request: pytest.FixtureRequest, tiny_world: Path) -> tuple[str, FrozenTarget]:
    path = target_path(tiny_world, request.param, "fp32")
    return request.param, FrozenTarget.from_pretrained(path, dtype=torch.float32)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_export_loads_back_and_computes_the_same(
    algorithm: str, family_target: tuple[str, FrozenTarget], tmp_path: Path
) -> None:
    family, target = family_target
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / f"{algorithm}-{family}-demo.yaml",
        [
            f"target.path={target.model.name_or_path}",
            "target.dtype=float32",  # an fp32 export: the comparison can be exact
            "data.train=unused",
            *(["draft.loss=hard_ce"] if loss_from_data(algorithm) else []),
        ],
    )
    spec = get_draft(algorithm)
    trained = perturbed_draft(spec, cfg.draft, target, seed=0)
    out = export_state(trained.state_dict(), cfg, tmp_path / "drafter", {"step": 0})

    exported = load_file(str(out / "model.safetensors"))
    fresh = perturbed_draft(spec, cfg.draft, target, seed=1)
    state = fresh.state_dict()
    trainable = {n for n, p in fresh.named_parameters() if p.requires_grad}
    assert trainable <= exported.keys() | {"mask_embedding"}, "a trained tensor is not exported"
    loaded = {n: t for n, t in exported.items() if n in state}
    if "mask_embedding" in state:  # P-EAGLE writes it into the embedding's mask row
        loaded["mask_embedding"] = exported["embed_tokens.weight"][int(state["mask_token_id"])]
    fresh.load_state_dict({**state, **loaded})

    expected = loss_of(spec, trained, cfg.draft, target)
    assert not torch.equal(
        loss_of(spec, perturbed_draft(spec, cfg.draft, target, 1), cfg.draft, target), expected
    )
    assert torch.equal(loss_of(spec, fresh, cfg.draft, target), expected)
