"""The chunked loss over the vocabulary (drafts/vocab_loss.py) against plain references that
form the whole [rows, vocabulary] logits with log_softmax, on vocabularies above 32k ids
(the target's whole vocabulary and a draft vocabulary of some of its rows), rows that do not
fill the last chunk and weights other than 1 (zeros included): every loss of the menu, its
value, and the gradients of the draft's hidden state and head; and a training step of each
algorithm keeps no [tokens, vocabulary] tensor for backward."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from vocab_loss_cases import DRAFT_SETTINGS, VOCAB, reference, wide_target

from eagle_train.data.loader import Batch
from eagle_train.drafts.registry import get_draft
from eagle_train.drafts.vocab_loss import LOSS_NAMES, TargetRows, vocab_loss

DRAFT_VOCAB = 33_000  # above 32,767 too


@pytest.mark.parametrize("loss", LOSS_NAMES)
@pytest.mark.parametrize("scored", [VOCAB, DRAFT_VOCAB])
def test_every_loss_matches_whole_vocabulary_log_softmax(loss: str, scored: int) -> None:
    g = torch.Generator().manual_seed(LOSS_NAMES.index(loss) + scored)
    rows, h, th, positions = 37, 16, 24, 50
    ids = torch.randperm(VOCAB, generator=g)[:scored].sort().values  # the scored rows
    hidden = torch.randn(rows, h, generator=g).requires_grad_()
    head = (0.5 * torch.randn(scored, h, generator=g)).requires_grad_()
    target_hidden = torch.randn(positions, th, generator=g)
    target_head = torch.randn(VOCAB, th, generator=g)
    index = torch.randint(0, positions, (rows,), generator=g)
    labels = torch.randint(-1, scored, (rows,), generator=g)  # -1: outside the vocabulary
    weights = torch.rand(rows, generator=g) * (torch.rand(rows, generator=g) > 0.2)
    # a sharp target in some rows (the draft far from it: TV and LK in their two regimes)
    target_head[:, 0] *= 1 + 4 * (torch.arange(VOCAB) % 7 == 0)

    target = TargetRows(target_hidden, index, target_head[ids])
    got = vocab_loss(hidden, head, weights, loss, target, labels, chunk_rows=8)

    # the reference in float64: what is left is the chunked fp32 path's own rounding
    h64, w64 = hidden.double(), head.double()
    z = h64 @ w64.T  # (rows, V): what the chunked path never keeps
    t = target_hidden.double()[index] @ target_head.double()[ids].T
    per_row = reference(loss, z, t, labels)
    want = (weights.double() * per_row).sum()
    # fp32 log-softmax over 40k logits of up to ~100: relative errors of ~1e-5 per row
    torch.testing.assert_close(got.loss.double(), want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.per_row.double(), per_row.detach(), rtol=1e-4, atol=1e-6)
    assert torch.equal(got.draft_argmax, (hidden @ head.T).argmax(-1))
    assert torch.equal(got.target_argmax, t.argmax(-1))
    grads = torch.autograd.grad(got.loss * 3.0, [hidden, head])  # the incoming gradient scales
    for a, b in zip(grads, torch.autograd.grad(want * 3.0, [hidden, head]), strict=True):
        # fp32 sums over 40k terms: tolerance relative to the gradient's scale
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


def test_entropy_turns_soft_cross_entropy_into_forward_kl() -> None:
    g = torch.Generator().manual_seed(3)
    hidden, head = torch.randn(9, 8, generator=g), torch.randn(VOCAB, 8, generator=g)
    target = TargetRows(torch.randn(9, 8, generator=g), torch.arange(9), head * 2)
    out = vocab_loss(hidden, head, torch.ones(9), "forward_kl", target, entropy=True)
    logq = torch.log_softmax(hidden @ head.T, -1)
    logp = torch.log_softmax(target.hidden @ target.weight.T, -1)
    kl = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(out.per_row - out.entropy, kl, rtol=1e-4, atol=1e-5)


def test_a_bf16_frozen_head_scores_like_the_module() -> None:
    # DFlash: fp32 draft hidden through the target's frozen bf16 head, in fp32 after.
    g = torch.Generator().manual_seed(4)
    head = torch.nn.Linear(16, VOCAB, bias=False).bfloat16().requires_grad_(False)
    hidden = torch.randn(21, 16, generator=g).requires_grad_()
    labels = torch.randint(0, VOCAB, (21,), generator=g)
    weights = torch.rand(21, generator=g)
    got = vocab_loss(hidden, head.weight, weights, "hard_ce", labels=labels, chunk_rows=5)
    z = head(hidden.to(torch.bfloat16)).float()
    want = (weights * F.cross_entropy(z, labels, reduction="none")).sum()
    torch.testing.assert_close(got.loss, want)
    (a,), (b,) = torch.autograd.grad(got.loss, [hidden]), torch.autograd.grad(want, [hidden])
    torch.testing.assert_close(a, b)


def test_no_gradient_no_backward_state() -> None:
    head = torch.randn(VOCAB, 8, requires_grad=True)
    with torch.no_grad():
        out = vocab_loss(
            torch.randn(5, 8), head, torch.ones(5), "hard_ce", labels=torch.ones(5).long()
        )
    assert out.loss.grad_fn is None and out.loss.item() > 0


def test_a_loss_name_outside_the_menu_is_refused() -> None:
    with pytest.raises(ValueError, match="draft.loss 'kl': expected one of forward_kl, "):
        vocab_loss(torch.randn(2, 4), torch.randn(VOCAB, 4), torch.ones(2), "kl")


@pytest.mark.parametrize("algorithm", list(DRAFT_SETTINGS))
@pytest.mark.parametrize("loss", ["forward_kl", "hard_ce"])
def test_a_training_step_keeps_no_tokens_by_vocabulary_tensor(algorithm: str, loss: str) -> None:
    """Of the tensors autograd saved for backward during a step's loss, those still held
    when the loss is returned: none has a vocabulary-sized dimension but the head and
    embedding weights themselves (V, H)."""
    target = wide_target()
    spec = get_draft(algorithm)
    cfg = spec.config_cls(**DRAFT_SETTINGS[algorithm], loss=loss)
    draft = spec.build(cfg, target, None)
    t = 40
    ids = torch.randint(4, VOCAB, (2, t))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # a prompt
    batch = Batch(ids, mask, torch.ones_like(ids), torch.tensor([t, t - 9]))
    features = target.features(ids, None, spec.target_layer_ids(cfg, target.description))
    saved: list[weakref.ref] = []

    def pack(x: Tensor) -> Tensor:
        saved.append(weakref.ref(x))
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        result = spec.compute_loss(draft, features, batch, cfg)
    gc.collect()
    # what the graph still holds once the loss is computed (chunks' own graphs are gone)
    kept = [tuple(x.shape) for ref in saved if (x := ref()) is not None]
    assert kept, "the hook saw the draft's graph"
    wide = [s for s in kept if VOCAB in s or DRAFT_VOCAB in s]
    assert all(len(s) == 2 and 32 in s for s in wide), wide  # (V, H) weights only
    result.loss.backward()
    assert "logits" not in features.__dict__  # nor were the target's full logits formed
