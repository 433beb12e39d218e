"""Attention kernels the drafts share: causal attention with extra per-query keys, fast.

Three ways to compute ``softmax(q . [causal keys, extra keys of this query])``:

- ``chunked`` (each draft's own exact reference: fp32 scores chunk by chunk, hand-written
  backward);
- ``fused`` (CPU): the causal part through torch's fused flash kernel, which also returns
  the row log-sum-exp; the few extra keys are merged into the same softmax through it. The
  backward calls the flash backward with the merged output and a rescaled gradient (the
  ring-attention identity), so no score matrix is ever materialised and the cost of a step
  is that of one ordinary causal attention;
- ``flex`` (CUDA): ``flex_attention`` compiled, the causal and extra keys concatenated and a
  block mask that visits only the blocks a query can see.

Backends are chosen per draft by its ``attention`` config field ("auto": flex on CUDA, the
fastest exact path on CPU).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def resolve(name: str, device: torch.device, cpu_default: str) -> str:
    """The backend to run: ``auto`` is flex on CUDA and ``cpu_default`` elsewhere."""
    if name == "auto":
        return "flex" if device.type == "cuda" else cpu_default
    if name == "fused" and device.type != "cpu":
        raise ValueError("draft.attention=fused runs on CPU; use flex or chunked on GPU")
    return name


def causal_plus_extra(q: Tensor, k0: Tensor, v0: Tensor, kx: Tensor, vx: Tensor) -> Tensor:
    """Fused path: q, k0, v0 ``(B,h,T,D)`` causal; kx, vx ``(B,h,T,J,D)`` J extra keys of
    each query. Returns ``(B,h,T,D)`` in q's dtype. CPU only (torch's flash kernel)."""
    return _CausalPlusExtra.apply(q, k0, v0, kx, vx)


def _flash(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, True, scale=scale
    )
    return out, lse


class _CausalPlusExtra(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k0, v0, kx, vx):  # type: ignore[override]
        scale = 1.0 / math.sqrt(q.shape[-1])
        oc, lse_c = _flash(q, k0, v0, scale)  # (B,h,T,D), (B,h,T) fp32
        sx = (q.float().unsqueeze(-2) * kx.float()).sum(-1) * scale  # (B,h,T,J)
        lse = torch.logaddexp(lse_c, torch.logsumexp(sx, dim=-1))
        wc = torch.exp(lse_c - lse).unsqueeze(-1)
        px = torch.exp(sx - lse.unsqueeze(-1))
        out = wc * oc.float() + (px.unsqueeze(-1) * vx.float()).sum(-2)
        out_q = out.to(q.dtype)
        ctx.save_for_backward(q, k0, v0, kx, vx, out_q, lse_c, lse)
        ctx.scale = scale
        return out_q

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k0, v0, kx, vx, out, lse_c, lse = ctx.saved_tensors
        scale = ctx.scale
        dout32 = dout.float()
        wc = torch.exp(lse_c - lse).unsqueeze(-1)
        # Causal part: P_total = wc * P_causal, and the flash backward's rowsum(dO * O) with
        # dO' = wc * dO and O = the merged output is wc * rowsum(dO * O): dS = wc P (dP - D).
        dq, dk0, dv0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            (wc * dout32).to(q.dtype), q, k0, v0, out, lse_c, 0.0, True, scale=scale
        )
        qf, kxf, vxf = q.float(), kx.float(), vx.float()
        delta = (dout32 * out.float()).sum(-1, keepdim=True)  # (B,h,T,1)
        px = torch.exp((qf.unsqueeze(-2) * kxf).sum(-1) * scale - lse.unsqueeze(-1))
        dsx = px * ((dout32.unsqueeze(-2) * vxf).sum(-1) - delta)  # (B,h,T,J)
        dq = dq.float() + (dsx.unsqueeze(-1) * kxf).sum(-2) * scale
        dkx = dsx.unsqueeze(-1) * qf.unsqueeze(-2) * scale
        dvx = px.unsqueeze(-1) * dout32.unsqueeze(-2)
        return dq.to(q.dtype), dk0, dv0, dkx.to(kx.dtype), dvx.to(vx.dtype)


@functools.cache
def _compiled_flex() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    # Default dynamism: the first new sequence length recompiles with dynamic shapes, so
    # batches of varying length do not exhaust the recompile limit (and fall to eager flex).
    return torch.compile(flex_attention)


def flex(q: Tensor, k: Tensor, v: Tensor, mask_mod: Callable, batch: int | None) -> Tensor:
    """``flex_attention(q, k, v)`` under the block mask of ``mask_mod`` (compiled on CUDA,
    eager elsewhere, where torch supports forward only). ``batch``: None when the mask is
    the same for every sequence."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask = create_block_mask(mask_mod, batch, None, q.shape[-2], k.shape[-2], device=q.device)
    return flex_masked(q, k, v, mask)


def flex_masked(q: Tensor, k: Tensor, v: Tensor, block_mask: object) -> Tensor:
    """``flex_attention`` with a prebuilt block mask (compiled on CUDA, eager elsewhere)."""
    from torch.nn.attention.flex_attention import flex_attention

    fn = _compiled_flex() if q.device.type == "cuda" else flex_attention
    return fn(q, k, v, block_mask=block_mask)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: object) -> Tensor:
    """Attention under ``mask``: a boolean tensor (SDPA), a flex ``BlockMask``, or None
    (causal)."""
    if mask is None or isinstance(mask, Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    return flex_masked(q, k, v, mask)


def flex_causal_plus_extra(q: Tensor, k0: Tensor, v0: Tensor, kx: Tensor, vx: Tensor) -> Tensor:
    """Same as ``causal_plus_extra`` through flex attention: keys ``[k0 (T), kx (T*J)]``,
    query t sees k0[:t+1] and kx[t, :]."""
    b, h, t, j, d = kx.shape
    keys = torch.cat([k0, kx.reshape(b, h, t * j, d)], dim=2)
    values = torch.cat([v0, vx.reshape(b, h, t * j, d)], dim=2)

    def mask_mod(bi, hi, qi, ki):
        return (ki <= qi) | ((ki >= t) & ((ki - t) // j == qi))

    return flex(q, keys, values, mask_mod, None)
