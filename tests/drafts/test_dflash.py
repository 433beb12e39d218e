"""DFlash draft: layer ids, block attention vs brute-force and dense references, the full
multi-block forward vs one block at a time, anchors, slot weights, loss alignment, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

from eagle_train.data.loader import Batch
from eagle_train.drafts import vocab_loss
from eagle_train.drafts.dflash.attention import block_attention
from eagle_train.drafts.dflash.blocks import (
    default_layer_ids,
    loss_gamma,
    sample_anchors,
    select_layer_ids,
    slot_mask,
    slot_weights,
    valid_anchors,
)
from eagle_train.drafts.dflash.config import DFlashConfig
from eagle_train.drafts.dflash.loss import BlockStats, dflash_loss
from eagle_train.drafts.registry import get_draft, identify_drafter
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.target_model import FrozenTarget, describe_target
from eagle_train.target_model.frozen import TargetFeatures

SPEC = get_draft("dflash")
GOLDEN = Path(__file__).resolve().parents[2] / "export" / "golden"
MASK = 3


def test_default_layer_ids() -> None:
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_layer_ids(28, 1) == [14]
    assert default_layer_ids(8, 3) == [1, 3, 5]
    assert select_layer_ids([2, 0, 1], 5, 4) == [0, 1, 2]  # explicit wins, sorted


@pytest.mark.parametrize("explicit, n", [(None, 3), ([0, 0, 1], 3), ([1, 4], 2)])
def test_bad_layer_ids_name_the_key(explicit, n) -> None:
    with pytest.raises(ValueError, match=r"(?s)0\.\.3.*draft.target_layer_ids"):
        select_layer_ids(explicit, n, 4)  # 4 layers: the default [1, 1, 1] collides


def test_after_k_layers_convention() -> None:
    cfg = DFlashConfig(target_layer_ids=[0, 2], mask_token_id=MASK)
    assert SPEC.target_layer_ids(cfg, describe_target(Qwen3Config(num_hidden_layers=4))) == [1, 3]


def brute_force_attention(q, k_ctx, v_ctx, k_blk, v_blk, anchors):
    """One (sequence, head, block, slot) at a time: the keys it may see, a plain softmax."""
    out = torch.zeros_like(q)
    bt, h, n, b, d = q.shape
    for i in range(bt):
        for j in range(h):
            for m in range(n):
                a = int(anchors[i, m])
                keys = torch.cat([k_ctx[i, j, :a], k_blk[i, j, m]])
                values = torch.cat([v_ctx[i, j, :a], v_blk[i, j, m]])
                for s in range(b):
                    w = torch.softmax(keys @ q[i, j, m, s] / math.sqrt(d), dim=0)
                    out[i, j, m, s] = w @ values
    return out


def attention_inputs(seed: int = 0, bt=2, h=2, t=11, n=4, b=3, d=8):
    g = torch.Generator().manual_seed(seed)
    q, kb, vb = (torch.randn(bt, h, n, b, d, generator=g) for _ in range(3))
    kc, vc = (torch.randn(bt, h, t, d, generator=g) for _ in range(2))
    # ascending real anchors, then padding blocks at 0 (as sample_anchors lays them out)
    anchors = torch.tensor([[1, 4, 8, 10], [2, 9, 0, 0]])
    return q, kc, vc, kb, vb, anchors


@pytest.mark.parametrize("chunk_bytes", [1, 2**30])  # one block per chunk / one chunk
def test_block_attention_matches_brute_force(chunk_bytes: int) -> None:
    q, kc, vc, kb, vb, anchors = attention_inputs()
    got = block_attention(q, kc, vc, kb, vb, anchors, chunk_bytes)
    torch.testing.assert_close(got, brute_force_attention(q, kc, vc, kb, vb, anchors))


def dense_mask_attention(q, k_ctx, v_ctx, k_blk, v_blk, anchors):
    """All blocks' keys concatenated after the context, one dense boolean mask."""
    bt, h, n, b, d = q.shape
    t = k_ctx.shape[2]
    keys = torch.cat([k_ctx, k_blk.reshape(bt, h, n * b, d)], 2)
    values = torch.cat([v_ctx, v_blk.reshape(bt, h, n * b, d)], 2)
    q_block = torch.arange(n).repeat_interleave(b)  # block of each query / block key
    ctx_ok = torch.arange(t)[None, None, :] < anchors.repeat_interleave(b, 1)[:, :, None]
    blk_ok = (q_block[:, None] == q_block[None, :]).expand(bt, -1, -1)
    mask = torch.cat([ctx_ok, blk_ok], -1)[:, None]  # (Bt, 1, N*B, T+N*B)
    out = F.scaled_dot_product_attention(q.reshape(bt, h, n * b, d), keys, values, attn_mask=mask)
    return out.view(bt, h, n, b, d)


def test_block_attention_matches_dense_mask_forward_and_backward() -> None:
    inputs = [x.requires_grad_() if x.is_floating_point() else x for x in attention_inputs(1)]
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(2))
    got = block_attention(*inputs, chunk_bytes=1)
    got_grads = torch.autograd.grad(got, inputs[:5], grad)
    ref = dense_mask_attention(*inputs)
    ref_grads = torch.autograd.grad(ref, inputs[:5], grad)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def tiny_target(mask_in_vocab: bool = True) -> FrozenTarget:
    config = Qwen3Config(
        vocab_size=64,
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
    cfg = DFlashConfig(
        target_layer_ids=[0, 1, 2], num_layers=2, block_size=4, mask_token_id=MASK, **kw
    )
    torch.manual_seed(1)
    draft = SPEC.build(cfg, target, None)
    with torch.no_grad():  # norms away from 1 so that every weight matters
        for p in draft.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return cfg, draft


def one_block_reference(draft, aux, ids, a: int) -> torch.Tensor:
    """vLLM's view of one block: context K/V of positions < a, the block's own queries,
    keys and values at positions a..a+B-1, plain unmasked attention."""
    s = draft.shape
    embed, _ = draft._shared
    ctx = draft.hidden_norm(draft.fc(aux[:, :a]))
    h = embed(torch.tensor([[int(ids[0, a])] + [MASK] * (s.block_size - 1)]))
    pos_ctx, pos_blk = torch.arange(a)[None], torch.arange(a, a + s.block_size)[None]
    for layer in draft.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.queries(x, draft.rotary(x, pos_blk))
        kb, vb = attn.keys_values(x, draft.rotary(x, pos_blk))
        kc, vc = attn.keys_values(ctx, draft.rotary(ctx, pos_ctx))
        o = F.scaled_dot_product_attention(q, torch.cat([kc, kb], 2), torch.cat([vc, vb], 2))
        h = h + attn.o_proj(o.transpose(1, 2).reshape(1, s.block_size, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.norm(h)[0]


def test_many_blocks_in_one_forward_equal_one_block_at_a_time() -> None:
    target = tiny_target()
    cfg, draft = build(target)
    ids = torch.randint(4, 64, (1, 20), generator=torch.Generator().manual_seed(3))
    aux = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description)).aux
    anchors = torch.tensor([[1, 5, 6, 12, 16]])
    with torch.no_grad():
        got = draft(aux, ids, anchors)[0]
        for m, a in enumerate(anchors[0].tolist()):
            torch.testing.assert_close(
                got[m], one_block_reference(draft, aux, ids, a), rtol=1e-4, atol=1e-4
            )


def test_propose_is_the_block_anchored_at_the_next_token() -> None:
    target = tiny_target()
    cfg, draft = build(target)
    ids = torch.randint(4, 64, (1, 9), generator=torch.Generator().manual_seed(4))
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    got = SPEC.propose(draft, features, ids, cfg, 3)
    assert got.shape == (1, 9, 3)
    for t in range(8):  # [t, k] guesses x_{t+2+k}: slot k+1 of the block anchored at t+1
        with torch.no_grad():
            ref = draft.logits(one_block_reference(draft, features.aux, ids, t + 1)).argmax(-1)
        assert got[0, t].tolist() == ref[1:].tolist()
    with pytest.raises(ValueError, match="at most 3"):
        SPEC.propose(draft, features, ids, cfg, 4)


def test_anchors_of_a_short_turn_and_of_a_turn_end() -> None:
    # prompt 0-1, a 2-token turn at 2-3 (shorter than B-1 = 3), user 4-5, a 5-token turn at
    # 6-10, a trailing unsupervised token 11; length 12, one padding column.
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0]])
    # B=4: a >= 1, a+3 < 12, loss_mask[a+1] = 1  ->  a in {1, 2, 5, 6, 7, 8}
    # (a full supervised block would keep only {5, 6, 7}: nothing of the short turn, and
    # the turn's last token 10 never at slot 1 or 2)
    ok = valid_anchors(loss_mask, torch.tensor([12]), 4)
    assert ok[0].nonzero().squeeze(1).tolist() == [1, 2, 5, 6, 7, 8]
    anchors = torch.tensor([[1, 2, 5, 8, 0]])
    valid = torch.tensor([[True, True, True, True, False]])
    # slot k of anchor a is supervised iff loss_mask[a+k]
    assert slot_mask(loss_mask, anchors, valid, 4).int().tolist() == [
        [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0]]
    ]


def test_anchor_block_must_fit_in_the_sequence() -> None:
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]])
    # length 6: a+3 < 6 -> a <= 2; a >= 1 (a = 0 has no context)
    assert valid_anchors(loss_mask, torch.tensor([6]), 4).int().tolist() == [
        [0, 1, 1, 0, 0, 0, 0, 0]
    ]


def test_sample_anchors_valid_bounded_resampled_and_seeded() -> None:
    g = torch.Generator().manual_seed(0)
    loss_mask = (torch.rand(3, 60, generator=g) > 0.15).long()
    lengths = torch.tensor([60, 45, 4])  # the last row is too short for a block
    ok = valid_anchors(loss_mask, lengths, 4)
    torch.manual_seed(5)
    first = sample_anchors(loss_mask, lengths, 4, 6)
    second = sample_anchors(loss_mask, lengths, 4, 6)
    torch.manual_seed(5)
    again = sample_anchors(loss_mask, lengths, 4, 6)
    assert torch.equal(first.positions, again.positions)
    assert not torch.equal(first.positions, second.positions)
    for s in (first, second):
        assert s.positions.shape[1] <= 6
        for row in range(3):
            real = s.positions[row][s.valid[row]].tolist()
            assert real == sorted(set(real)) and all(ok[row, a] for a in real)
            assert len(real) == min(6, int(ok[row].sum()))
        assert not s.valid[2].any()


def test_slot_weights_and_gamma_rule() -> None:
    assert [loss_gamma(b) for b in (16, 10, 8)] == [7.0, 5.0, 4.0]
    assert loss_gamma(12) == pytest.approx(5 + 2 / 3) and loss_gamma(4) == 2.0
    assert loss_gamma(32) == pytest.approx(7 + 16 / 3) and loss_gamma(2) == 1.0
    assert loss_gamma(16, 3.0) == 3.0
    w = slot_weights(16, 7.0)
    assert w.shape == (15,) and w[0] == 1.0
    assert w[14].item() == pytest.approx(math.exp(-14 / 7))


@pytest.mark.parametrize("loss_target", ["hard_ce", "forward_kl"])
def test_loss_alignment(loss_target: str) -> None:
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 5, (1, 8), generator=g)
    target_logits = torch.randn(1, 8, 5, generator=g)
    logits = torch.randn(1, 2, 2, 5, generator=g)  # 2 blocks of B=3: slots 1, 2
    anchors = torch.tensor([[2, 0]])
    mask = torch.tensor([[[True, True], [False, False]]])
    weights = torch.tensor([1.0, 0.5])
    greedy = target_logits.argmax(-1)
    # the logits themselves as hidden states through identity heads; hard never reads them
    soft = TargetHead(target_logits, torch.eye(5)) if loss_target == "forward_kl" else None

    def loss(mask: torch.Tensor, loss_target: str = loss_target) -> BlockStats:
        return dflash_loss(
            logits, torch.eye(5), ids, greedy, soft, anchors, mask, weights, loss_target
        )

    stats = loss(mask)
    per = []
    for k in (1, 2):  # slot k of the block at 2 predicts x_{2+k}; target logits at 2+k-1
        logq = torch.log_softmax(logits[0, 0, k - 1], -1)
        if loss_target == "hard_ce":
            per.append(-logq[ids[0, 2 + k]])
        else:
            per.append(-(torch.softmax(target_logits[0, 1 + k], -1) * logq).sum())
    assert stats.loss.item() == pytest.approx(((per[0] + 0.5 * per[1]) / 1.5).item(), rel=1e-6)
    # slot 2 unsupervised (the turn ended at slot 1): the loss is slot 1's alone
    mask[0, 0, 1] = False
    only = loss(mask)
    assert only.loss.item() == pytest.approx(per[0].item(), rel=1e-6)
    assert stats.correct[0, 0].tolist() == [
        bool(logits[0, 0, k - 1].argmax() == target_logits[0, 1 + k].argmax()) for k in (1, 2)
    ]
    with pytest.raises(ValueError, match="draft.loss 'auto': expected one of forward_kl, "):
        loss(mask, "auto")
    if loss_target == "hard_ce":
        with pytest.raises(ValueError, match="forward_kl: the target's logits are needed"):
            loss(mask, "forward_kl")


@pytest.mark.parametrize("loss_target", ["hard_ce", "forward_kl"])
def test_chunked_head_equals_a_plain_loss(
    loss_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vocab_loss, "CHUNK_ELEMENTS", 6)  # one slot (of 6 logits) per chunk
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 6, (2, 12), generator=g)
    target_logits = torch.randn(2, 12, 6, generator=g)
    hidden = torch.randn(2, 4, 3, 5, generator=g, requires_grad=True)
    head = torch.nn.Linear(5, 6, bias=False)
    anchors = torch.tensor([[1, 3, 5, 8], [2, 6, 0, 0]])
    # per-slot masks: a turn ending inside a block, padding blocks all zero
    mask = torch.tensor(
        [[[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], [[1, 1, 1], [0, 1, 1], [0] * 3, [0] * 3]]
    ).bool()
    weights = torch.tensor([1.0, 0.7, 0.4])
    soft = TargetHead(target_logits, torch.eye(6)) if loss_target == "forward_kl" else None
    got = dflash_loss(
        hidden,
        head.weight,
        ids,
        target_logits.argmax(-1),
        soft,
        anchors,
        mask,
        weights,
        loss_target,
    )
    # plain: all logits at once, one term per supervised (block, slot)
    logq = torch.log_softmax(head(hidden), -1)
    terms, total_w = [], 0.0
    for b, m, j in mask.nonzero().tolist():
        for k in (j + 1,):
            a = int(anchors[b, m])
            if loss_target == "hard_ce":
                loss = -logq[b, m, k - 1, ids[b, a + k]]
            else:
                loss = -(torch.softmax(target_logits[b, a + k - 1], -1) * logq[b, m, k - 1]).sum()
            terms.append(weights[k - 1] * loss)
            total_w += float(weights[k - 1])
    ref = torch.stack(terms).sum() / total_w
    torch.testing.assert_close(got.loss, ref)
    for a, r in zip(
        torch.autograd.grad(got.loss, [hidden, head.weight]),
        torch.autograd.grad(ref, [hidden, head.weight]),
        strict=True,
    ):
        torch.testing.assert_close(a, r)


def test_compute_loss_trains_draft_only_and_shares_target_head() -> None:
    target = tiny_target()
    cfg, draft = build(target, num_anchors=5)
    ids = torch.randint(4, 64, (2, 16))
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([16, 10]))
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    result = SPEC.compute_loss(draft, features, batch, cfg)
    result.loss.backward()
    assert result.weight == 5 + 5 and {"acc_0", "acc_2", "sim_accept_len"} <= result.metrics.keys()
    assert all(p.grad is not None for p in draft.parameters())
    assert all(p.grad is None for p in target.parameters())
    assert not any(k.startswith(("embed", "lm_head")) for k in draft.state_dict())


@pytest.mark.parametrize("loss_target", ["hard_ce", "forward_kl"])
def test_stored_greedy_tokens_score_like_the_full_logits(loss_target: str) -> None:
    # A feature cache (format 2) stores the target's greedy tokens: the target's full logits
    # are then never formed (its head runs chunk by chunk inside the loss, and not at all
    # for hard labels), and the metrics are those of the full logits.
    target = tiny_target()
    cfg, draft = build(target, num_anchors=6, loss=loss_target)
    ids = torch.randint(4, 64, (2, 24))
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([24, 20]))
    online = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    with torch.no_grad():
        greedy = target.model(input_ids=ids).logits.argmax(-1)  # transformers' own forward

    def stored(tokens: torch.Tensor) -> TargetFeatures:
        return TargetFeatures(online.aux, online.final, online.head, stored_greedy=tokens)

    draft.eval()  # fixed anchors: every call scores the same blocks
    with torch.no_grad():
        want = SPEC.compute_loss(draft, online, batch, cfg).metrics
        features = stored(greedy.int())
        got = SPEC.compute_loss(draft, features, batch, cfg).metrics
        shifted = SPEC.compute_loss(draft, stored(greedy.roll(1, -1).int()), batch, cfg).metrics
    assert got == pytest.approx(want)
    assert "logits" not in features.__dict__
    assert shifted["acc_0"] != want["acc_0"]  # the stored tokens are what is scored


def test_validation_scores_fixed_anchors_and_leaves_the_rng_alone() -> None:
    target = tiny_target()
    cfg, draft = build(target, num_anchors=3)
    ids = torch.randint(4, 64, (2, 30))
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([30, 30]))
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    draft.eval()
    state = torch.get_rng_state()
    with torch.no_grad():
        first, second = (SPEC.compute_loss(draft, features, batch, cfg) for _ in range(2))
    assert torch.equal(torch.get_rng_state(), state)
    assert first.metrics == second.metrics
    draft.train()
    with torch.no_grad():
        third, fourth = (SPEC.compute_loss(draft, features, batch, cfg) for _ in range(2))
    assert third.metrics["loss"] != fourth.metrics["loss"]  # 3 of 27 anchors, re-drawn


def test_mask_token_must_be_a_target_token() -> None:
    target = tiny_target()
    cfg = DFlashConfig(target_layer_ids=[0, 1, 2], mask_token_id=64)
    with pytest.raises(ValueError, match=r"draft.mask_token_id 64 .*vocab_size 64"):
        SPEC.build(cfg, target, None)
    with pytest.raises(ValueError, match="draft.mask_token_id is not set"):
        SPEC.build(cfg.model_copy(update={"mask_token_id": None}), target, None)  # no tokenizer


def test_formats_are_told_apart() -> None:
    for family in ("llama", "qwen3"):
        dflash = json.loads((GOLDEN / f"dflash-{family}-demo.config.json").read_text())
        eagle3 = json.loads((GOLDEN / f"eagle3-{family}-demo.config.json").read_text())
        assert identify_drafter(dflash) is SPEC and identify_drafter(dflash, "dflash") is SPEC
        assert identify_drafter(eagle3) is get_draft("eagle3")
        parallel = {**eagle3, "parallel_drafting": True, "mask_token_id": MASK}
        assert not SPEC.recognizes(parallel)
