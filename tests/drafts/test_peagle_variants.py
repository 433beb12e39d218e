"""P-EAGLE with EAGLE-3.1's norms before fc (``norm_before_fc``, ``fc_norm``), as vLLM's
EAGLE-3 loader serves a parallel-drafting drafter (``llama_eagle3.py``): the aux features AND
``mask_hidden`` go through the norms and fc (vLLM's proposer passes ``mask_hidden`` through
``combine_hidden_states``), checked against a hand-written RMSNorm; ``norm_output``, which
vLLM reads only for a next draft step that parallel drafting never takes, is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO
from peagle_drafts import build
from run_configs import target_path

from eagle_train.config import ConfigError, load_config
from eagle_train.drafts.peagle.sampling import Elements
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("norm_before_fc, fc_norm", [(True, False), (False, True), (True, True)])
def test_aux_features_and_mask_hidden_pass_the_norms_before_fc(
    tiny_world: Path, norm_before_fc: bool, fc_norm: bool
) -> None:
    target = FrozenTarget.from_pretrained(
        target_path(tiny_world, "llama", "fp32"), dtype=torch.float32
    )
    _, draft = build(target, norm_before_fc=norm_before_fc, fc_norm=fc_norm)
    eps, n = draft.shape.rms_norm_eps, 3
    seen: list[torch.Tensor] = []
    draft.fc.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    torch.manual_seed(2)
    t = 6
    aux = torch.randn(1, t, n * draft.shape.target_hidden_size)
    ids = torch.randint(4, 200, (1, t))
    anchor, depth = torch.tensor([[0, 0, 3, 3]]), torch.tensor([[0, 1, 0, 2]])
    draft(aux, ids, Elements(anchor=anchor, depth=depth, valid=torch.ones_like(anchor).bool()))

    def normed(x: torch.Tensor) -> torch.Tensor:
        if norm_before_fc:
            x = rms(x, draft.input_norm.weight, eps)
        if fc_norm:
            chunks = x.chunk(n, dim=-1)
            x = torch.cat(
                [rms(c, w.weight, eps) for c, w in zip(chunks, draft.fc_norm, strict=True)], -1
            )
        return x

    want = torch.stack([normed(aux[0, 0]), normed(draft.mask_hidden), normed(aux[0, 3])])
    got = seen[0][0]
    torch.testing.assert_close(got[[0, 1, 2]], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[3], want[1], atol=1e-5, rtol=1e-5)  # every deep element


def test_norm_output_is_refused_for_peagle_in_one_line() -> None:
    path = REPO / "configs" / "train" / "peagle-llama-demo.yaml"
    with pytest.raises(ConfigError, match="P-EAGLE drafts every depth in one forward"):
        load_config(RunConfig, path, ["draft.norm_output=true"])
    cfg = load_config(RunConfig, path, ["draft.norm_before_fc=true", "draft.fc_norm=true"])
    assert cfg.draft.norm_before_fc and cfg.draft.fc_norm
