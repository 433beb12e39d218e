"""Fast attention kernels against hand-written dense references (CPU).

fused (the CPU default for the training-time test) is checked forward and backward in fp32;
flex (the CUDA path) forward only, since torch runs flex attention's backward only on GPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from eagle_train.drafts import kernels
from eagle_train.drafts.dflash.attention import block_attention
from eagle_train.drafts.peagle.sampling import Elements, attention_mask, block_mask
from eagle_train.drafts.ttt_attention import ttt_attention


def dense_ttt(q, k0, v0, kd, vd):
    """softmax over [k0[:t+1], kd[t, :]] per query t, written out densely."""
    b, h, t, j, d = kd.shape
    s0 = q @ k0.transpose(-1, -2)
    s0 = s0.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    sd = torch.einsum("bhtd,bhtjd->bhtj", q, kd)
    p = torch.softmax(torch.cat([s0, sd], -1) / math.sqrt(d), -1)
    return p[..., :t] @ v0 + torch.einsum("bhtj,bhtjd->bhtd", p[..., t:], vd)


def ttt_inputs(seed=0, b=2, h=3, t=37, j=3, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    return [make(b, h, t, d) for _ in range(3)] + [make(b, h, t, j, d) for _ in range(2)]


@pytest.mark.parametrize("j", [1, 4])
def test_fused_ttt_forward_and_backward_equal_dense(j):
    inputs = [x.requires_grad_() for x in ttt_inputs(j=j)]
    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1))
    ref = dense_ttt(*inputs)
    ref_grads = torch.autograd.grad(ref, inputs, grad)
    for backend in ("fused", "chunked"):
        out = ttt_attention(*inputs, backend=backend)
        torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
        for got, want in zip(torch.autograd.grad(out, inputs, grad), ref_grads, strict=True):
            torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_fused_ttt_bf16_close_to_exact_path():
    inputs = [x.requires_grad_() for x in ttt_inputs(dtype=torch.bfloat16)]
    grad = torch.randn(inputs[0].shape).bfloat16()
    exact = ttt_attention(*inputs, backend="chunked")
    exact_grads = torch.autograd.grad(exact, inputs, grad)
    fused = ttt_attention(*inputs, backend="fused")
    torch.testing.assert_close(fused, exact, atol=2e-2, rtol=2e-2)
    for got, want in zip(torch.autograd.grad(fused, inputs, grad), exact_grads, strict=True):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2)


def test_flex_ttt_forward_equals_dense():
    inputs = ttt_inputs(t=150, j=2)  # more than one 128-row block of queries and keys
    with torch.no_grad():
        out = ttt_attention(*inputs, backend="flex")
    torch.testing.assert_close(out, dense_ttt(*inputs), atol=2e-6, rtol=1e-5)


def test_flex_block_attention_forward_equals_exact_path():
    g = torch.Generator().manual_seed(0)
    bt, h, t, n, blk, d = 2, 2, 140, 9, 4, 16
    q, kb, vb = (torch.randn(bt, h, n, blk, d, generator=g) for _ in range(3))
    kc, vc = (torch.randn(bt, h, t, d, generator=g) for _ in range(2))
    anchors = torch.sort(torch.randint(0, t, (bt, n), generator=g), dim=1).values
    anchors[0, 0] = 0  # a block that sees no context, only itself
    exact = block_attention(q, kc, vc, kb, vb, anchors, backend="chunked")
    flex = block_attention(q, kc, vc, kb, vb, anchors, backend="flex")
    torch.testing.assert_close(flex, exact, atol=2e-6, rtol=1e-5)


def test_flex_block_mask_equals_dense_element_mask():
    g = torch.Generator().manual_seed(0)
    grid = torch.rand(2, 40, 4, generator=g) < 0.5
    grid[1, 30:] = False  # the second sequence has fewer elements: padding columns
    e = Elements.from_grid(grid)
    m = e.anchor.shape[1]
    q, k, v = (torch.randn(2, 2, m, 16, generator=g) for _ in range(3))
    dense = kernels.masked_attention(q, k, v, attention_mask(e))
    flex = kernels.masked_attention(q, k, v, block_mask(e))
    torch.testing.assert_close(flex, dense, atol=2e-6, rtol=1e-5)


def test_backend_resolution():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert kernels.resolve("auto", cuda, cpu_default="fused") == "flex"
    assert kernels.resolve("auto", cpu, cpu_default="fused") == "fused"
    assert kernels.resolve("auto", cpu, cpu_default="chunked") == "chunked"
    assert kernels.resolve("chunked", cuda, cpu_default="fused") == "chunked"
    with pytest.raises(ValueError, match="fused runs on CPU"):
        kernels.resolve("fused", cuda, cpu_default="fused")
