"""The loss menu (``draft.loss``) as every algorithm applies it: EAGLE-3's training step
under each loss against a reference built from the draft's own whole-vocabulary logits on a
40k vocabulary (weights per TTT step, label offsets, the target's logits at t+1+k); every
algorithm trains under every loss (a finite loss that differs between losses, gradients
reaching every trainable parameter); a name outside the menu is a one-line config error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vocab_loss_cases import DRAFT_SETTINGS, VOCAB, reference, wide_target

from eagle_train.config import ConfigError, load_config
from eagle_train.data.loader import Batch
from eagle_train.drafts.eagle3.loss import step_weights, supervised_slots
from eagle_train.drafts.registry import get_draft
from eagle_train.drafts.vocab_loss import LOSS_NAMES
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]


def batch_of(t: int = 24) -> Batch:
    torch.manual_seed(5)
    ids = torch.randint(4, VOCAB, (2, t))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # a prompt
    mask[1, 15:] = 0  # a user turn after the answer
    return Batch(ids, mask, torch.ones_like(ids), torch.tensor([t, t - 5]))


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_eagle3_step_under_each_loss_matches_whole_logits(loss: str) -> None:
    target = wide_target()
    spec = get_draft("eagle3")
    cfg = spec.config_cls(**DRAFT_SETTINGS["eagle3"], loss=loss, step_decay=0.7)
    draft = spec.build(cfg, target, None)
    batch = batch_of()
    features = target.features(
        batch.input_ids, None, spec.target_layer_ids(cfg, target.description)
    )
    result = spec.compute_loss(draft, features, batch, cfg)
    got = torch.autograd.grad(result.loss, [p for p in draft.parameters() if p.requires_grad])

    at = supervised_slots(batch.loss_mask, batch.lengths, 3)
    out = draft(features.aux, batch.input_ids, 3, 0, at)  # the head applied: (N_k, V) logits
    target_logits = (features.final @ target.lm_head().weight.T).double()  # (B, T, V)
    want = torch.zeros((), dtype=torch.float64)
    for k, (logits, mask) in enumerate(zip(out.logits, at, strict=True)):
        rows, slots = mask.nonzero(as_tuple=True)
        labels = batch.input_ids[rows, slots + 2 + k]  # step k at slot t drafts x_{t+2+k}
        per = reference(loss, logits.double(), target_logits[rows, slots + 1 + k], labels)
        want = want + step_weights(3, 0.7)[k] * per.mean()
    assert result.loss.item() == pytest.approx(want.item(), rel=1e-4)
    expected = torch.autograd.grad(want, [p for p in draft.parameters() if p.requires_grad])
    for a, b in zip(got, expected, strict=True):
        if loss in ("tv", "lk"):
            # min(p, q) is not smooth: a token where p and q nearly tie may fall on either
            # side in fp32 and fp64, moving that entry by ~q; compare the whole gradient
            error = (a.double() - b).norm() / b.norm()
            assert error < 1e-3, (loss, float(error))
        else:
            torch.testing.assert_close(a, b.float(), rtol=1e-3, atol=1e-4 * float(b.abs().max()))


@pytest.mark.parametrize("algorithm", list(DRAFT_SETTINGS))
def test_every_algorithm_trains_under_every_loss(algorithm: str) -> None:
    target = wide_target()
    spec = get_draft(algorithm)
    batch = batch_of()
    values = {}
    for loss in LOSS_NAMES:
        cfg = spec.config_cls(**DRAFT_SETTINGS[algorithm], loss=loss)
        draft = spec.build(cfg, target, None)
        draft.eval()  # the same anchors / elements under every loss
        layers = spec.target_layer_ids(cfg, target.description)
        features = target.features(batch.input_ids, None, layers)
        result = spec.compute_loss(draft, features, batch, cfg)
        result.loss.backward()
        trained = [p for p in draft.parameters() if p.requires_grad]
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trained), loss
        values[loss] = result.loss.item()
    assert all(torch.isfinite(torch.tensor(v)) for v in values.values()), values
    assert len({round(v, 6) for v in values.values()}) == len(LOSS_NAMES), values
    assert 0 <= values["tv"] <= 1 + 1e-6 and 0 <= values["jsd"] <= 0.6932 * 2, values


@pytest.mark.parametrize("algorithm", ["eagle1", "eagle3", "peagle", "dflash"])
def test_a_loss_outside_the_menu_is_one_line_naming_the_key(algorithm: str) -> None:
    path = REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, path, ["target.path=t", "data.train=d", "draft.loss=kl_div"])
    # the project's config error: a header, then one line per bad key
    (line,) = [x for x in str(err.value).splitlines() if "draft.loss" in x]
    assert all(f"'{name}'" in line for name in LOSS_NAMES) and "kl_div" in line, line


def test_dflash_loss_target_is_refused_with_where_it_moved() -> None:
    path = REPO / "configs" / "train" / "dflash-llama-demo.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, path, ["target.path=t", "data.train=d", "draft.loss_target=hard"])
    (line,) = [x for x in str(err.value).splitlines() if "loss_target" in x]
    assert "moved to draft.loss (hard is hard_ce, distill is forward_kl" in line, line
