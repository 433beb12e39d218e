"""TTT attention equals a dense masked softmax over all steps' keys, forward and backward."""

from __future__ import annotations

import pytest
import torch

from eagle_train.drafts import ttt_attention as attention
from eagle_train.drafts.ttt_attention import ttt_attention


def dense_reference(q, k0, v0, kd, vd):
    """Concatenate [k0 | kd_1 .. kd_J] per query and mask: causal on k0, own slot on kd."""
    B, h, T, D = q.shape
    s0 = q @ k0.transpose(-1, -2)
    s0 = s0.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    sd = torch.einsum("bhtd,bhtjd->bhtj", q, kd)
    p = torch.softmax(torch.cat([s0, sd], -1) / D**0.5, -1)
    return p[..., :T] @ v0 + torch.einsum("bhtj,bhtjd->bhtd", p[..., T:], vd)


def make(B=2, h=3, T=11, D=8, J=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, h, T, D)] * 3 + [(B, h, T, J, D)] * 2
    return [torch.randn(s, generator=g, dtype=dtype, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("J", [0, 1, 3])
def test_matches_dense_forward_and_backward(J: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "_CHUNK_BYTES", 2 * 3 * 11 * 4 * 4)  # 4-row chunks
    ours_in = make(J=J)
    ref_in = [t.detach().clone().requires_grad_() for t in ours_in]
    ours, ref = ttt_attention(*ours_in), dense_reference(*ref_in)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)  # scores run in fp32
    grad = torch.randn_like(ref)
    ours.backward(grad)
    ref.backward(grad)
    for a, b in zip(ours_in, ref_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_bf16_inputs_give_bf16_outputs_close_to_fp32() -> None:
    inputs = make(dtype=torch.float32, J=2)
    out32 = ttt_attention(*inputs)
    out16 = ttt_attention(*[t.detach().bfloat16() for t in inputs])
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), out32, rtol=3e-2, atol=3e-2)


def test_saved_memory_is_linear_in_sequence() -> None:
    """What autograd keeps is the inputs, output and lse: no (T, T) tensor is saved."""
    q, k0, v0, kd, vd = make(T=64, J=3, dtype=torch.float32)
    out = ttt_attention(q, k0, v0, kd, vd)
    saved = sum(t.numel() for t in out.grad_fn.saved_tensors)
    inputs_out_lse = 4 * q.numel() + 2 * kd.numel() + q.numel() // q.shape[-1]
    assert saved == inputs_out_lse  # a (B, h, T, T) score tensor alone would add 49152
