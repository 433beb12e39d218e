"""Training-time-test attention without a (T, T*K) score matrix.

At TTT step j a query at slot t attends the step-0 keys of slots ``s <= t`` (causal) plus its
own chain's keys from steps 1..j at the same slot (one extra key per step, "the diagonal").
A dense formulation concatenates all steps' keys and masks a (T, (j+1)T) score matrix, which
autograd keeps for every step: O(K T^2) memory. Here the union of the two key sets is one
softmax computed flash-style in query chunks, with a hand-written backward that recomputes
the scores chunk by chunk. Saved for backward: the inputs, the output and the row
log-sum-exp, O(K T D). Scores are computed in fp32 whatever the input dtype.

Right padding needs no mask: a valid query's causal keys are all valid.

This exact path is the reference; ``drafts/kernels.py`` holds the fast ones (``fused`` on
CPU, ``flex`` on CUDA), chosen by the ``backend`` argument and tested equal to it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from eagle_train.drafts import kernels

# Transient score memory per chunk (bytes); bounds the chunk of queries processed at once.
_CHUNK_BYTES = 64 * 2**20


def ttt_attention(
    q: Tensor, k0: Tensor, v0: Tensor, kd: Tensor, vd: Tensor, backend: str = "chunked"
) -> Tensor:
    """Softmax attention of ``q`` over causal ``k0/v0`` plus per-slot diagonal ``kd/vd``.

    Shapes: q, k0, v0 ``(B, h, T, D)`` (k0/v0 already repeated for GQA); kd, vd
    ``(B, h, T, J, D)`` with J >= 0 extra keys per slot. Returns ``(B, h, T, D)`` in q's dtype.
    ``backend``: chunked (exact reference), fused, flex or auto (see ``drafts/kernels.py``).
    """
    backend = kernels.resolve(backend, q.device, cpu_default="fused")
    if backend == "fused" and kd.shape[3] > 0:
        return kernels.causal_plus_extra(q, k0, v0, kd, vd)
    if backend == "flex" and kd.shape[3] > 0:
        return kernels.flex_causal_plus_extra(q, k0, v0, kd, vd)
    return _TTTAttention.apply(q, k0, v0, kd, vd)


def rows_per_chunk(batch: int, heads: int, length: int, chunk_bytes: int | None = None) -> int:
    """Query rows per chunk so that a chunk's fp32 scores over ``length`` keys, (batch,
    heads, rows, length), stay near ``chunk_bytes`` (None: ``_CHUNK_BYTES`` as it is at the
    call, so the tests' smaller budget reaches it)."""
    budget = _CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return max(1, min(length, budget // (4 * batch * heads * max(length, 1))))


def chain_scores(qc: Tensor, k0: Tensor, kdc: Tensor, start: int, scale: float) -> Tensor:
    """fp32 scores of a query chunk ``[start, start+c)`` over keys ``[0, start+c)`` + diagonal."""
    end = start + qc.shape[2]
    s0 = torch.matmul(qc, k0[:, :, :end].float().transpose(-1, -2)) * scale  # (B,h,c,end)
    rows = torch.arange(start, end, device=qc.device)[:, None]
    cols = torch.arange(end, device=qc.device)[None, :]
    s0 = s0.masked_fill(cols > rows, float("-inf"))
    sd = (qc.unsqueeze(-2) * kdc.float()).sum(-1) * scale  # (B,h,c,J)
    return torch.cat([s0, sd], dim=-1)


class _TTTAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k0: Tensor, v0: Tensor, kd: Tensor, vd: Tensor) -> Tensor:  # type: ignore[override]
        scale = 1.0 / math.sqrt(q.shape[-1])
        length, chunk = q.shape[2], rows_per_chunk(*q.shape[:3])
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        for start in range(0, length, chunk):
            end = min(length, start + chunk)
            qc = q[:, :, start:end].float()
            s = chain_scores(qc, k0, kd[:, :, start:end], start, scale)
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            z = p.sum(-1, keepdim=True)
            o = torch.matmul(p[..., :end], v0[:, :, :end].float())
            o = o + (p[..., end:].unsqueeze(-1) * vd[:, :, start:end].float()).sum(-2)
            out[:, :, start:end] = o / z
            lse[:, :, start:end] = (m + torch.log(z)).squeeze(-1)
        ctx.save_for_backward(q, k0, v0, kd, vd, out, lse)
        ctx.scale, ctx.chunk = scale, chunk
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):  # type: ignore[override]
        q, k0, v0, kd, vd, out, lse = ctx.saved_tensors
        scale, chunk, length = ctx.scale, ctx.chunk, q.shape[2]
        dout = dout.float()
        delta = (dout * out).sum(-1)  # (B,h,T): rowsum(P * dP)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk0 = torch.zeros(k0.shape, dtype=torch.float32, device=q.device)
        dv0 = torch.zeros(v0.shape, dtype=torch.float32, device=q.device)
        dkd = torch.zeros(kd.shape, dtype=torch.float32, device=q.device)
        dvd = torch.zeros(vd.shape, dtype=torch.float32, device=q.device)
        for start in range(0, length, chunk):
            end = min(length, start + chunk)
            qc, doc = q[:, :, start:end].float(), dout[:, :, start:end]
            kdc, vdc = kd[:, :, start:end].float(), vd[:, :, start:end].float()
            p = torch.exp(chain_scores(qc, k0, kdc, start, scale) - lse[:, :, start:end, None])
            p0, pd = p[..., :end], p[..., end:]
            k0c, v0c = k0[:, :, :end].float(), v0[:, :, :end].float()
            dv0[:, :, :end] += torch.matmul(p0.transpose(-1, -2), doc)
            dvd[:, :, start:end] = pd.unsqueeze(-1) * doc.unsqueeze(-2)
            dc = delta[:, :, start:end, None]
            ds0 = p0 * (torch.matmul(doc, v0c.transpose(-1, -2)) - dc)
            dsd = pd * ((doc.unsqueeze(-2) * vdc).sum(-1) - dc)
            dq[:, :, start:end] = (
                torch.matmul(ds0, k0c) + (dsd.unsqueeze(-1) * kdc).sum(-2)
            ) * scale
            dk0[:, :, :end] += torch.matmul(ds0.transpose(-1, -2), qc) * scale
            dkd[:, :, start:end] = dsd.unsqueeze(-1) * qc.unsqueeze(-2) * scale
        return (
            dq.to(q.dtype),
            dk0.to(k0.dtype),
            dv0.to(v0.dtype),
            dkd.to(kd.dtype),
            dvd.to(vd.dtype),
        )
