"""EAGLE-3 draft: TTT forward equals an explicit per-slot drafting chain; loss alignment."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from realistic import random_ids
from run_configs import target_path

from eagle_train.data.loader import Batch
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.eagle3.loss import eagle3_loss, step_weights
from eagle_train.drafts.eagle3.model import Eagle3Draft
from eagle_train.drafts.eagle_family import valid_slots
from eagle_train.drafts.registry import get_draft
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.target_model import FrozenTarget

SPEC = get_draft("eagle3")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def target(request: pytest.FixtureRequest, wide_world: Path) -> FrozenTarget:
    path = target_path(wide_world, request.param, "fp32")
    return FrozenTarget.from_pretrained(path, dtype=torch.float32)


def build(target: FrozenTarget, steps: int = 3) -> tuple[Eagle3Config, Eagle3Draft]:
    cfg = Eagle3Config(aux_layer_ids=[1, 2, 3], ttt_steps=steps)
    torch.manual_seed(0)
    draft = SPEC.build(cfg, target, None)
    with torch.no_grad():  # make the layer non-trivial everywhere
        for p in draft.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return cfg, draft


def chain_reference(draft: Eagle3Draft, aux: torch.Tensor, ids: torch.Tensor, steps: int):
    """Draft like vLLM does, one slot at a time: step-0 keys of slots <= t from the real
    features, then the slot's own chain of keys, RoPE position t+k at step k."""
    layer = draft.layers[0]
    length = ids.shape[1]

    def qkv(hidden, token, pos):
        x = torch.cat(
            [layer.input_layernorm(draft.embed_tokens(token)), layer.hidden_norm(hidden)], -1
        )
        return layer.self_attn.project(x, draft.rotary(x, pos))

    def finish(hidden, attn):
        h = hidden + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(1, 1, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    g = draft.fc(aux)
    positions = torch.arange(length)[None]
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], 1)
    _, k0, v0 = qkv(g, nxt, positions)
    out = torch.zeros(steps, length, draft.lm_head.out_features)
    for t in range(length):
        hidden, keys, values = g[:, t : t + 1], [k0[:, :, : t + 1]], [v0[:, :, : t + 1]]
        for k in range(steps):
            tok = ids[:, min(t + 1 + k, length - 1)].view(1, 1)
            q, kk, vv = qkv(hidden, tok, torch.tensor([[t + k]]))
            if k > 0:
                keys.append(kk)
                values.append(vv)
            attn = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2))
            hidden = finish(hidden, attn)
            out[k, t] = draft.lm_head(draft.norm(hidden))[0, 0]
    return out


def test_ttt_forward_equals_explicit_chain(target: FrozenTarget) -> None:
    cfg, draft = build(target, steps=3)
    ids = torch.randint(
        3, target.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1)
    )
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    with torch.no_grad():
        got = draft(features.aux, ids, 3).logits
        ref = chain_reference(draft, features.aux, ids, 3)
    for k in range(3):
        torch.testing.assert_close(got[k][0], ref[k], rtol=1e-4, atol=1e-4)


def test_valid_slots_alignment() -> None:
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    lengths = torch.tensor([6])  # the last position is padding
    # step 0 at slot t predicts x_{t+2}: supervised when loss_mask[t+2]=1 and t+2 < 6
    assert valid_slots(loss_mask, lengths, 0).int().tolist() == [[1, 1, 1, 1, 0, 0, 0]]
    assert valid_slots(loss_mask, lengths, 1).int().tolist() == [[1, 1, 1, 0, 0, 0, 0]]
    assert valid_slots(loss_mask, lengths, 3).int().tolist() == [[1, 0, 0, 0, 0, 0, 0]]


def test_step_weights_are_normalised() -> None:
    w = step_weights(3, 0.8)
    assert sum(w) == pytest.approx(1.0)
    assert w[1] / w[0] == pytest.approx(0.8) and w[2] / w[1] == pytest.approx(0.8)


def test_loss_uses_target_distribution_restricted_to_draft_vocab() -> None:
    torch.manual_seed(0)
    vocab, vd, length = 10, 4, 5
    d2t = torch.tensor([1, 2, 3, 3])  # draft ids -> target ids 1, 3, 5, 6
    target_logits = torch.randn(1, length, vocab)
    draft_logits = [torch.randn(1, length, vd)]
    mask, lengths = torch.ones(1, length, dtype=torch.long), torch.tensor([length])
    ids = torch.tensor([1, 3, 5, 6])
    greedy = target_logits.argmax(-1)
    # one row, every token supervised: step 0's slots are 0 .. length - 3
    stats = eagle3_loss(
        [draft_logits[0][0, : length - 2]],
        torch.eye(vd),  # the logits themselves as hidden states through identity heads
        TargetHead(target_logits, torch.eye(vocab)[ids]),
        greedy,
        vocab,
        mask,
        lengths,
        d2t,
        0.8,
    )
    expected = []
    for t in range(length - 2):  # slots whose x_{t+2} exists
        p = torch.softmax(target_logits[0, t + 1, ids], -1)
        expected.append(-(p * torch.log_softmax(draft_logits[0][0, t], -1)).sum())
    assert stats.loss.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-5)


def test_drop_out_of_vocab_leaves_out_slots_the_draft_cannot_propose() -> None:
    torch.manual_seed(1)
    vocab, length = 10, 6
    d2t = torch.tensor([1, 2, 3, 3])  # draft vocab = target ids 1, 3, 5, 6
    target_logits = torch.randn(1, length, vocab)
    # target argmax at positions 1..5: 3 (in), 7 (out), 5 (in), 0 (out), 6 (in)
    for pos, top in zip(range(1, 6), (3, 7, 5, 0, 6), strict=True):
        target_logits[0, pos, top] = 10.0
    draft_logits = [torch.randn(1, length, 4), torch.randn(1, length, 4)]
    mask, lengths = torch.ones(1, length, dtype=torch.long), torch.tensor([length])
    ids = torch.tensor([1, 3, 5, 6])

    def soft_ce(step: int, t: int) -> torch.Tensor:  # step k at slot t: target at t+1+k
        p = torch.softmax(target_logits[0, t + 1 + step, ids], -1)
        return -(p * torch.log_softmax(draft_logits[step][0, t], -1)).sum()

    greedy = target_logits.argmax(-1)
    # the logits themselves as hidden states through identity heads
    head, target = torch.eye(4), TargetHead(target_logits, torch.eye(vocab)[ids])
    # every token supervised: step k reads slots 0 .. length - 3 - k
    at_slots = [draft_logits[k][0, : length - 2 - k] for k in range(2)]
    stats = eagle3_loss(at_slots, head, target, greedy, vocab, mask, lengths, d2t, 0.5, True)
    # step 0: slots 0..3 read positions 1..4 -> kept 0 and 2; step 1: slots 0..2 read
    # positions 2..4 -> kept 1 (position 3). Weights 0.5^k normalised: 2/3, 1/3.
    step0 = (soft_ce(0, 0) + soft_ce(0, 2)) / 2
    step1 = soft_ce(1, 1)
    assert stats.loss.item() == pytest.approx((2 / 3 * step0 + 1 / 3 * step1).item(), rel=1e-5)
    # metrics still count every supervised slot (what serving would see)
    assert stats.valid[0].int().tolist() == [[1, 1, 1, 1, 0, 0]]
    kept = eagle3_loss(at_slots, head, target, greedy, vocab, mask, lengths, d2t, 0.5, False)
    all0 = torch.stack([soft_ce(0, t) for t in range(4)]).mean()
    assert kept.step_losses[0] == pytest.approx(all0.item(), rel=1e-5)


def test_build_copies_target_embedding_frozen_and_head_rows(target: FrozenTarget) -> None:
    from eagle_train.data.vocab import build_vocab_mapping

    counts = torch.arange(target.config.vocab_size).flip(0)  # low ids most frequent
    vocab = build_vocab_mapping(counts, 64)
    draft = SPEC.build(Eagle3Config(aux_layer_ids=[1, 2, 3]), target, vocab)
    assert torch.equal(draft.embed_tokens.weight, target.embed_tokens().weight)
    assert not draft.embed_tokens.weight.requires_grad
    assert torch.equal(draft.lm_head.weight, target.lm_head().weight[:64])
    assert (
        torch.equal(draft.d2t, vocab.d2t) and draft.fc.in_features == 3 * target.config.hidden_size
    )


def test_colliding_default_layer_ids_are_a_clear_error(target: FrozenTarget) -> None:
    with pytest.raises(ValueError, match="aux_layer_ids"):
        SPEC.target_layer_ids(Eagle3Config(), target.description)  # 4 layers: (2, 2, 1)


def test_compute_loss_backpropagates_to_draft_only(target: FrozenTarget) -> None:
    cfg, draft = build(target)
    ids = random_ids(target.model.name_or_path, (2, 12), skip=3)
    batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids), torch.tensor([12, 9]))
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    result = SPEC.compute_loss(draft, features, batch, cfg)
    result.loss.backward()
    assert {"acc_0", "acc_2", "sim_accept_len", "loss_1"} <= result.metrics.keys()
    assert result.weight == 10 + 7
    assert all(p.grad is not None for p in draft.parameters() if p.requires_grad)
    assert all(p.grad is None for p in target.parameters())


@pytest.mark.parametrize("num_layers", [1, 2])
def test_compute_loss_on_supervised_slots_equals_the_full_logits_reference(
    target: FrozenTarget, num_layers: int
) -> None:
    """The training step computes only the slots some loss term reads (``head_at``): its
    loss, its gradients and acc_0 equal a soft CE written by hand over the draft's logits at
    every slot (plus the copy loss of that full forward), on a batch with a prompt
    (unsupervised) and right padding, through a draft vocabulary, with 1 and 2 layers."""
    from eagle_train.data.vocab import build_vocab_mapping
    from eagle_train.drafts.eagle3.copy_loss import copy_attention_loss

    vocab = build_vocab_mapping(torch.arange(target.config.vocab_size).flip(0), 48)
    cfg = Eagle3Config(
        aux_layer_ids=[1, 2, 3],
        ttt_steps=3,
        num_layers=num_layers,
        copy_supervision=1.0,
        copy_steps=3,
    )
    torch.manual_seed(0)
    draft = SPEC.build(cfg, target, vocab)
    ids = random_ids(target.model.name_or_path, (2, 14), skip=3)
    mask = torch.zeros_like(ids)
    mask[0, 5:] = 1  # a 5-token prompt, then the answer
    mask[1, 3:10] = 1  # answer to 10, then 4 tokens of padding
    lengths = torch.tensor([14, 10])
    batch = Batch(ids, mask, (torch.arange(14) < lengths[:, None]).long(), lengths)
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))

    result = SPEC.compute_loss(draft, features, batch, cfg)
    result.loss.backward()
    got = [p.grad.clone() for p in draft.parameters() if p.requires_grad]
    draft.zero_grad()

    out = draft(features.aux, ids, 3, 3)
    full = out.logits  # (B, T, Vd) at every slot
    draft_ids = torch.arange(48) + draft.d2t
    target_draft = features.logits[..., draft_ids]
    weights = [1 / 2.44, 0.8 / 2.44, 0.64 / 2.44]
    loss, right, slots0 = torch.zeros(()), 0, 0
    for k in range(3):
        terms = []
        for i in range(2):
            for s in range(14):
                label = s + 2 + k
                if label >= lengths[i] or mask[i, label] == 0:
                    continue
                p = torch.softmax(target_draft[i, label - 1], -1)
                terms.append(-(p * torch.log_softmax(full[k][i, s], -1)).sum())
                if k == 0:
                    slots0 += 1
                    top = features.logits[i, label - 1].argmax()
                    right += int(draft_ids[full[0][i, s].argmax()] == top)
        loss = loss + weights[k] * torch.stack(terms).mean()
    loss = loss + copy_attention_loss(out.copy_qk, ids, mask, lengths).loss
    loss.backward()
    want = [p.grad for p in draft.parameters() if p.requires_grad]

    assert result.loss.item() == pytest.approx(loss.item(), rel=1e-5)
    assert result.weight == slots0 == 9 + 7  # slots 3..11 and 1..7
    assert result.metrics["acc_0"] == pytest.approx(right / slots0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
