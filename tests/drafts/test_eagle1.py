"""EAGLE-1 draft: shapes, the loss against a direct per-slot computation, the export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from realistic import random_ids
from run_configs import target_path

from eagle_train.data.loader import Batch
from eagle_train.drafts.eagle1.config import Eagle1Config
from eagle_train.drafts.registry import get_draft, identify_drafter
from eagle_train.export import ExportError, validate_drafter
from eagle_train.target_model import FrozenTarget

SPEC = get_draft("eagle1")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def target(request: pytest.FixtureRequest, wide_world: Path) -> FrozenTarget:
    path = target_path(wide_world, request.param, "fp32")
    return FrozenTarget.from_pretrained(path, dtype=torch.float32)


def build(target: FrozenTarget, **kwargs):
    cfg = Eagle1Config(**kwargs)
    torch.manual_seed(0)
    return cfg, SPEC.build(cfg, target, None)


def make_batch(target: FrozenTarget) -> Batch:
    """Two rows of ids the target's tokenizer produces (past its first four special ones;
    none of its reserved ids, which no text holds), 24 and 17 long."""
    torch.manual_seed(1)
    ids = random_ids(target.model.name_or_path, (2, 24), skip=4)
    lengths = torch.tensor([24, 17])
    attention = (torch.arange(24)[None] < lengths[:, None]).long()
    loss_mask = attention.clone()
    loss_mask[:, :6] = 0
    return Batch(ids, loss_mask, attention, lengths)


def test_shapes_and_frozen_target_parts(target: FrozenTarget) -> None:
    cfg, draft = build(target, num_layers=2)
    h = target.config.hidden_size
    assert draft.fc.weight.shape == (h, 2 * h)
    assert draft.layers[0].input_layernorm is None and draft.layers[1].input_layernorm is not None
    trainable = {n for n, p in draft.named_parameters() if p.requires_grad}
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in trainable)
    assert torch.equal(draft.lm_head.weight, target.lm_head().weight)
    batch = make_batch(target)
    feats = target.features(batch.input_ids, batch.attention_mask, [])
    assert feats.aux.shape == (2, 24, 0)
    preds = draft(feats.final, batch.input_ids, 3)
    assert [p.shape for p in preds] == [(2, 24, h)] * 3
    assert SPEC.propose(draft, feats, batch.input_ids, cfg, 3).shape == (2, 24, 3)


def test_loss_pieces_match_a_direct_computation(target: FrozenTarget) -> None:
    cfg, draft = build(target, feature_noise=0.5)
    batch = make_batch(target)
    feats = target.features(batch.input_ids, batch.attention_mask, [])
    draft.eval()  # no noise: the loss is a function of the weights
    result = SPEC.compute_loss(draft, feats, batch, cfg)
    (pred,) = draft(feats.final, batch.input_ids, 1)
    reg, ce, n = [], [], 0
    for b in range(2):
        for t in range(24):
            if t + 2 < int(batch.lengths[b]) and batch.loss_mask[b, t + 2]:
                reg.append(F.smooth_l1_loss(pred[b, t], feats.final[b, t + 1]))
                p = torch.softmax(feats.logits[b, t + 1], -1)
                ce.append(-(p * torch.log_softmax(draft.lm_head(pred[b, t]), -1)).sum())
                n += 1
    feature, logit = torch.stack(reg).mean(), torch.stack(ce).mean()
    assert result.weight == n == 18 + 11
    assert result.metrics["loss_feature"] == pytest.approx(feature.item(), rel=1e-5)
    assert result.metrics["loss_logit"] == pytest.approx(logit.item(), rel=1e-5)
    torch.testing.assert_close(result.loss, feature + 0.1 * logit, rtol=1e-5, atol=1e-6)
    draft.train()  # training adds uniform noise to f_t: a different loss
    noisy = SPEC.compute_loss(draft, feats, batch, cfg)
    assert noisy.loss.item() != pytest.approx(result.loss.item(), rel=1e-4)


def test_export_matches_the_contract(target: FrozenTarget) -> None:
    cfg, draft = build(target, num_layers=2)
    drafter = SPEC.to_vllm(draft.state_dict(), cfg, target.description)
    validate_drafter(SPEC, drafter, target.description)
    assert drafter.method == "eagle" and drafter.config["architectures"] == ["LlamaForCausalLM"]
    assert drafter.config["vocab_size"] == target.config.vocab_size
    names = set(drafter.tensors)
    assert "layers.1.input_layernorm.weight" in names
    assert not names & {"layers.0.input_layernorm.weight", "norm.weight", "lm_head.weight"}
    assert identify_drafter(drafter.config) is SPEC
    assert identify_drafter(drafter.config, "eagle") is SPEC
    drafter.tensors["layers.0.input_layernorm.weight"] = torch.ones(target.config.hidden_size)
    with pytest.raises(ExportError, match="unexpected tensor layers.0.input_layernorm"):
        validate_drafter(SPEC, drafter, target.description)
