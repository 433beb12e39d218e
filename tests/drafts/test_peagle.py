"""P-EAGLE draft: attention rule, conditional-drop sampling, segmented gradients equal the
one-pass gradient, mask token resolution, the export and how eval-acceptance serves it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peagle_drafts import SPEC, build
from realistic import random_ids
from run_configs import target_path

from eagle_train.config import load_config
from eagle_train.data.loader import Batch
from eagle_train.drafts.peagle.config import PEagleConfig
from eagle_train.drafts.peagle.sampling import (
    Elements,
    attention_mask,
    keep_fractions,
    sample_elements,
    supervision,
)
from eagle_train.drafts.peagle.spec import in_vocab_elements
from eagle_train.drafts.registry import get_draft, identify_drafter
from eagle_train.evaluate.drafter import inspect_drafter
from eagle_train.export import export_state, validate_drafter
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def target(request: pytest.FixtureRequest, wide_world: Path) -> FrozenTarget:
    path = target_path(wide_world, request.param, "fp32")
    return FrozenTarget.from_pretrained(path, dtype=torch.float32)


def make_batch(target: FrozenTarget, t: int = 32) -> Batch:
    """Two rows of ids the target's tokenizer produces (random_ids), ``t`` and ``t - 9`` long."""
    torch.manual_seed(1)
    ids = random_ids(target.model.name_or_path, (2, t), skip=4)
    lengths = torch.tensor([t, t - 9])
    attention = (torch.arange(t)[None] < lengths[:, None]).long()
    loss_mask = attention.clone()
    loss_mask[:, :5] = 0
    return Batch(ids, loss_mask, attention, lengths)


def test_attention_mask_matches_the_rule_pair_by_pair() -> None:
    torch.manual_seed(0)
    lengths = torch.tensor([12, 7])
    grid = sample_elements(lengths, 12, 4, None, keep_fractions(4, 0.7, 0.2))
    e = Elements.from_grid(grid)
    mask = attention_mask(e)[:, 0]
    for b in range(2):
        m = e.anchor.shape[1]
        for i in range(m):
            for j in range(m):
                if not (e.valid[b, i] and e.valid[b, j]):
                    assert mask[b, i, j] == (i == j)  # padding sees itself only
                    continue
                aq, dq = int(e.anchor[b, i]), int(e.depth[b, i])
                ak, dk = int(e.anchor[b, j]), int(e.depth[b, j])
                expected = (dk == 0 and aq >= ak) or (aq == ak and dq >= dk)
                assert bool(mask[b, i, j]) == expected, (b, i, j)


def test_supervised_counts_per_depth_are_fractions_of_the_whole_valid_set() -> None:
    # N = 10 valid anchors (length 12, prompt 0-1): a = 0..9 has x_{a+2} in range.
    # K=4, r=0.8, r_min=0.2: n_d = int((N - d) * max(r^d, r_min)) = int(9*.8), int(8*.64),
    # int(7*.512) = 7, 5, 3 (compounding fractions of the previous depth gave 7, 4, 2)
    loss_mask = torch.tensor([[0, 0] + [1] * 10])
    lengths = torch.tensor([12])
    supervised = supervision(loss_mask, lengths, 4)
    for seed in range(5):
        torch.manual_seed(seed)
        grid = sample_elements(lengths, 12, 4, supervised, keep_fractions(4, 0.8, 0.2))
        assert grid[0, :, 0].nonzero().squeeze(1).tolist() == list(range(11))  # context
        assert [int((grid & supervised)[0, :, d].sum()) for d in range(4)] == [10, 7, 5, 3]
        for d in range(1, 4):
            assert not (grid[0, :, d] & ~grid[0, :, d - 1]).any()  # drawn from depth d-1


def test_deep_counts_do_not_compound() -> None:
    # N = 1000, K = 8, r = 0.8, r_min = 0.2: depth 7 keeps int(993 * 0.8^7) = 208 (21% of
    # depth 0), not 0.2% as max(r^d, r_min) of the previous depth would give
    t = 1002
    loss_mask = torch.ones(1, t, dtype=torch.long)
    lengths = torch.tensor([t])
    supervised = supervision(loss_mask, lengths, 8)
    torch.manual_seed(0)
    grid = sample_elements(lengths, t, 8, supervised, keep_fractions(8, 0.8, 0.2))
    counts = [int((grid & supervised)[0, :, d].sum()) for d in range(8)]
    assert counts == [1000, 799, 638, 510, 407, 326, 260, 208]
    # the floor: r=0.5 reaches r_min at depth 3, int(997*0.2) = 199
    grid = sample_elements(lengths, t, 5, supervised[..., :5], keep_fractions(5, 0.5, 0.2))
    assert [int((grid & supervised[..., :5])[0, :, d].sum()) for d in range(5)] == [
        1000,
        499,
        249,
        199,
        199,
    ]


def test_in_vocab_elements_read_the_target_argmax_at_a_plus_1_plus_d() -> None:
    argmax = torch.tensor([[0, 1, 4, 3, 2]])  # the target's argmax per position
    # draft vocab = target ids {1, 3} of 6; element (a, d) reads position min(a+1+d, 4)
    got = in_vocab_elements(argmax, torch.tensor([1, 3]), 2, 6)
    assert got[0].int().tolist() == [[1, 0], [0, 1], [1, 0], [0, 0], [0, 0]]


def test_evaluation_keeps_every_candidate() -> None:
    t, k, lengths = 40, 4, torch.tensor([40, 30])
    supervised = supervision(torch.ones(2, t, dtype=torch.long), lengths, k)
    full = sample_elements(lengths, t, k, supervised, None)
    assert full[0, : 40 - 2 - k + 1].all()
    assert (full & supervised).sum().item() == supervised.sum().item()


def test_segmented_gradient_equals_one_pass(target: FrozenTarget) -> None:
    cfg, draft = build(target)
    draft.train()
    batch = make_batch(target)
    feats = target.features(batch.input_ids, batch.attention_mask, [1, 2, 3])
    params = [p for p in draft.parameters() if p.requires_grad]

    torch.manual_seed(5)
    whole = SPEC.compute_loss(draft, feats, batch, cfg)
    whole.loss.backward()
    expected = [p.grad.clone() for p in params]
    draft.zero_grad()

    torch.manual_seed(5)  # the same sampling
    parts = SPEC.loss_parts(draft, feats, batch, cfg, num_segments=4)
    assert len(parts) == 4
    total, weight = 0.0, 0
    for part in parts:
        result = part()
        result.loss.backward()
        total += result.loss.item()
        weight += result.weight
        # DDP (find_unused_parameters=False): every part's backward reaches every parameter
        assert all(p.grad is not None for p in params)
    assert weight == whole.weight
    assert total == pytest.approx(whole.loss.item(), rel=1e-5)
    for p, g in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


def test_a_part_without_deep_elements_still_reaches_every_parameter(target) -> None:
    cfg, draft = build(target)
    batch = make_batch(target, t=16)
    batch.loss_mask.zero_()  # nothing supervised: no deep element at all
    feats = target.features(batch.input_ids, batch.attention_mask, [1, 2, 3])
    for part in SPEC.loss_parts(draft, feats, batch, cfg, num_segments=3):
        result = part()
        assert result.weight == 0
        draft.zero_grad(set_to_none=True)
        result.loss.backward()
        missing = [n for n, p in draft.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing


def test_shapes_propose_and_export(target: FrozenTarget) -> None:
    cfg, draft = build(target)
    h, v = target.config.hidden_size, target.config.vocab_size
    assert draft.mask_hidden.shape == (3 * h,) and int(draft.mask_token_id) == 3
    batch = make_batch(target)
    feats = target.features(batch.input_ids, batch.attention_mask, [1, 2, 3])
    e = Elements.from_grid(sample_elements(batch.lengths, 32, 3, None, None))
    assert draft(feats.aux, batch.input_ids, e).shape == (*e.anchor.shape, v)
    proposals = SPEC.propose(draft.eval(), feats, batch.input_ids, cfg, 3)
    assert proposals.shape == (2, 32, 3) and (proposals[:, :-1] >= 0).all()

    drafter = SPEC.to_vllm(draft.state_dict(), cfg, target.description)
    validate_drafter(SPEC, drafter, target.description)
    c = drafter.config
    assert (c["mask_token_id"], c["parallel_drafting"], c["num_hidden_layers"]) == (3, True, 2)
    assert drafter.extra_speculative_config == {"parallel_drafting": True}
    assert drafter.method == "eagle3" and drafter.num_speculative_tokens == 3
    assert torch.equal(drafter.tensors["embed_tokens.weight"][3], draft.mask_embedding)
    assert torch.equal(drafter.tensors["embed_tokens.weight"][4], draft.embed_tokens.weight[4])
    assert drafter.tensors["mask_hidden"].shape == (3 * h,)
    assert identify_drafter(c) is SPEC and identify_drafter(c, "eagle3") is SPEC
    assert not get_draft("eagle3").recognizes(c)


def test_mask_token_id_errors(target: FrozenTarget) -> None:
    v = target.config.vocab_size
    with pytest.raises(
        ValueError,
        match=rf"draft.mask_token_id {v} is outside the target "
        rf"vocabulary \(expected 0..{v - 1}\)",
    ):
        SPEC.build(PEagleConfig(aux_layer_ids=[1, 2, 3], mask_token_id=v), target, None)
    bare = FrozenTarget(target.model)
    bare.model.name_or_path = ""  # no tokenizer to ask
    try:
        with pytest.raises(ValueError, match="draft.mask_token_id is not set"):
            SPEC.build(PEagleConfig(aux_layer_ids=[1, 2, 3]), bare, None)
    finally:
        bare.model.name_or_path = str(target.model.name_or_path)


def test_eval_acceptance_serves_it_with_parallel_drafting(wide_world: Path, tmp_path: Path):
    target_dir = target_path(wide_world)
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "peagle-llama-demo.yaml",
        [f"target.path={target_dir}", "data.train=unused"],
    )
    state = SPEC.build(cfg.draft, FrozenTarget.from_pretrained(target_dir), None).state_dict()
    out = export_state(state, cfg, tmp_path / "drafter", {"step": 0})
    info = inspect_drafter(out, FrozenTarget.from_pretrained(target_dir).description)
    assert info.spec is SPEC
    assert info.speculative_config() == {
        "method": "eagle3",
        "model": str(out),
        "num_speculative_tokens": 3,
        "parallel_drafting": True,
    }
