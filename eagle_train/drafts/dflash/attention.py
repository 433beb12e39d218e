"""Block attention for many DFlash blocks of one sequence in one pass, without a dense mask.

Block n (anchor a_n, B slots) attends the context keys at positions ``s < a_n`` plus the B
keys of its own block (bidirectional). Concatenating the T context keys and all N*B block
keys and masking a dense (N*B, T + N*B) score matrix costs O(N*B*(T+N*B)) memory per head
and layer, kept by autograd (2048 tokens, 512 blocks of 16: 1.3 GiB per head in fp32). Here
the two key sets are one softmax computed flash-style over chunks of blocks, with a
hand-written backward that recomputes the scores chunk by chunk. Saved for backward: the
inputs, the output and the row log-sum-exp. Scores are fp32 whatever the input dtype.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from eagle_train.drafts import kernels

# Transient score memory per chunk (bytes); bounds the number of blocks processed at once.
_CHUNK_BYTES = 64 * 2**20


def block_attention(
    q: Tensor,
    k_ctx: Tensor,
    v_ctx: Tensor,
    k_blk: Tensor,
    v_blk: Tensor,
    anchors: Tensor,
    chunk_bytes: int = _CHUNK_BYTES,
    backend: str = "chunked",
) -> Tensor:
    """Softmax attention of block queries over their visible context and their own block.

    Shapes: q, k_blk, v_blk ``(Bt, h, N, B, D)``; k_ctx, v_ctx ``(Bt, h, T, D)`` (already
    repeated for GQA); anchors ``(Bt, N)`` long, best ascending per row (a chunk of blocks
    then reads only the context up to its largest anchor). Returns ``(Bt, h, N, B, D)`` in
    q's dtype. ``backend``: chunked (this exact path), flex (compiled flex attention with a
    block mask, CUDA) or auto (flex on CUDA, chunked elsewhere).
    """
    if kernels.resolve(backend, q.device, cpu_default="chunked") == "flex":
        return flex_block_attention(q, k_ctx, v_ctx, k_blk, v_blk, anchors)
    return _BlockAttention.apply(q, k_ctx, v_ctx, k_blk, v_blk, anchors, chunk_bytes)


def flex_block_attention(
    q: Tensor, k_ctx: Tensor, v_ctx: Tensor, k_blk: Tensor, v_blk: Tensor, anchors: Tensor
) -> Tensor:
    """``block_attention`` through flex attention: queries (N*B), keys [context T, blocks N*B];
    query slot i of block n sees context keys s < a_n and the keys of block n."""
    bt, h, n, b, d = q.shape
    length = k_ctx.shape[2]
    keys = torch.cat([k_ctx, k_blk.reshape(bt, h, n * b, d)], dim=2)
    values = torch.cat([v_ctx, v_blk.reshape(bt, h, n * b, d)], dim=2)

    def mask_mod(bi, hi, qi, ki):
        block = qi // b
        context = (ki < length) & (ki < anchors[bi, block])
        return context | ((ki >= length) & ((ki - length) // b == block))

    out = kernels.flex(q.reshape(bt, h, n * b, d), keys, values, mask_mod, bt)
    return out.view(bt, h, n, b, d)


def _chunks(q: Tensor, length: int, chunk_bytes: int) -> int:
    batch, heads, _, block, _ = q.shape
    per_block = 4 * batch * heads * block * (length + block)
    return max(1, chunk_bytes // max(per_block, 1))


def _scores(qc: Tensor, k_ctx: Tensor, kbc: Tensor, ac: Tensor, end: int, scale: float) -> Tensor:
    """fp32 scores (Bt, h, c, B, end + B) of a chunk of blocks: context [0, end) + own block."""
    bt, h, c, b, d = qc.shape
    s_ctx = torch.matmul(qc.reshape(bt, h, c * b, d), k_ctx[:, :, :end].float().transpose(-1, -2))
    s_ctx = s_ctx.view(bt, h, c, b, end)
    hidden = torch.arange(end, device=qc.device) >= ac[:, None, :, None, None]  # s >= a_n
    s_ctx = s_ctx.masked_fill(hidden, float("-inf"))
    s_blk = torch.matmul(qc, kbc.float().transpose(-1, -2))  # (Bt,h,c,B,B)
    return torch.cat([s_ctx, s_blk], dim=-1) * scale


def _chunk_plan(anchors: Tensor, num_blocks: int, chunk: int) -> list[tuple[int, int, int]]:
    """(first block, end block, context end) per chunk; one host sync for all of them."""
    starts = list(range(0, num_blocks, chunk))
    ends = [min(num_blocks, s + chunk) for s in starts]
    # running max over blocks: >= every anchor of the chunk even where padding breaks the order
    running = anchors.cummax(1).values.amax(0)
    maxima = running[torch.tensor(ends, device=anchors.device) - 1].tolist()
    return [(s, e, int(m)) for s, e, m in zip(starts, ends, maxima, strict=True)]


class _BlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k_ctx, v_ctx, k_blk, v_blk, anchors, chunk_bytes):  # type: ignore[override]
        scale = 1.0 / math.sqrt(q.shape[-1])
        plan = _chunk_plan(anchors, q.shape[2], _chunks(q, k_ctx.shape[2], chunk_bytes))
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.empty(q.shape[:4], dtype=torch.float32, device=q.device)
        for n0, n1, end in plan:
            qc = q[:, :, n0:n1].float()
            s = _scores(qc, k_ctx, k_blk[:, :, n0:n1], anchors[:, n0:n1], end, scale)
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            z = p.sum(-1, keepdim=True)
            o = _weighted_values(p, v_ctx, v_blk[:, :, n0:n1], end)
            out[:, :, n0:n1] = o / z
            lse[:, :, n0:n1] = (m + torch.log(z)).squeeze(-1)
        ctx.save_for_backward(q, k_ctx, v_ctx, k_blk, v_blk, anchors, out, lse)
        ctx.scale, ctx.plan = scale, plan
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k_ctx, v_ctx, k_blk, v_blk, anchors, out, lse = ctx.saved_tensors
        scale = ctx.scale
        dout = dout.float()
        delta = (dout * out).sum(-1, keepdim=True)  # rowsum(P * dP)
        f32 = dict(dtype=torch.float32, device=q.device)
        dq, dkb, dvb = (torch.zeros(t.shape, **f32) for t in (q, k_blk, v_blk))
        dkc, dvc = (torch.zeros(t.shape, **f32) for t in (k_ctx, v_ctx))
        for n0, n1, end in ctx.plan:
            qc, doc = q[:, :, n0:n1].float(), dout[:, :, n0:n1]
            kbc, vbc = k_blk[:, :, n0:n1].float(), v_blk[:, :, n0:n1].float()
            s = _scores(qc, k_ctx, kbc, anchors[:, n0:n1], end, scale)
            p = torch.exp(s - lse[:, :, n0:n1, :, None])
            bt, h, c, b, _ = p.shape
            p_ctx = p[..., :end].reshape(bt, h, c * b, end)
            p_blk = p[..., end:]
            doc_flat = doc.reshape(bt, h, c * b, -1)
            kc, vc = k_ctx[:, :, :end].float(), v_ctx[:, :, :end].float()
            dvc[:, :, :end] += torch.matmul(p_ctx.transpose(-1, -2), doc_flat)
            dvb[:, :, n0:n1] = torch.matmul(p_blk.transpose(-1, -2), doc)
            dc = delta[:, :, n0:n1]
            ds_ctx = p_ctx * (
                torch.matmul(doc_flat, vc.transpose(-1, -2)) - dc.reshape(bt, h, c * b, 1)
            )
            ds_blk = p_blk * (torch.matmul(doc, vbc.transpose(-1, -2)) - dc)
            dq[:, :, n0:n1] = (
                torch.matmul(ds_ctx, kc).view(bt, h, c, b, -1) + torch.matmul(ds_blk, kbc)
            ) * scale
            dkc[:, :, :end] += (
                torch.matmul(ds_ctx.transpose(-1, -2), qc.reshape(bt, h, c * b, -1)) * scale
            )
            dkb[:, :, n0:n1] = torch.matmul(ds_blk.transpose(-1, -2), qc) * scale
        return (
            dq.to(q.dtype),
            dkc.to(k_ctx.dtype),
            dvc.to(v_ctx.dtype),
            dkb.to(k_blk.dtype),
            dvb.to(v_blk.dtype),
            None,
            None,
        )


def _weighted_values(p: Tensor, v_ctx: Tensor, vbc: Tensor, end: int) -> Tensor:
    """(Bt,h,c,B,D) = P_ctx @ V_ctx[:end] + P_blk @ V_blk for one chunk."""
    bt, h, c, b, _ = p.shape
    o = torch.matmul(p[..., :end].reshape(bt, h, c * b, end), v_ctx[:, :, :end].float())
    return o.view(bt, h, c, b, -1) + torch.matmul(p[..., end:], vbc.float())
