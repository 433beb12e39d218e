"""The loss over the vocabulary, in chunks of rows, never keeping a [rows, vocabulary] tensor.

Every draft ends in a head (hidden -> vocabulary logits) and a loss against the target's
distribution at the same rows (or a hard label). Done whole, autograd keeps the draft's
logits, their log-softmax and the target's probabilities for backward: three fp32
[rows, vocabulary] tensors per training-time-test step, the bulk of a training step's memory
(docs/results/2026-12-07-vocab-loss-memory.md). Here the rows go through the head in chunks;
each chunk computes its logits, the target's logits (from the target's final hidden state
and its head's rows: the target's [tokens, vocabulary] logits are never formed either), the
loss, and at once the gradients of the draft's hidden state and of the head's weight (the
chunk's own autograd graph, freed before the next chunk). What stays until backward is
O(rows): the hidden state's gradient, the per-row loss, entropy and argmaxes, plus one
head-sized weight gradient. Backward only scales them by the incoming gradient.

The loss menu (``draft.loss``), per row, with p the target's distribution and q the draft's:

- ``forward_kl``: cross-entropy -sum p log q (KL(p||q) plus the target's entropy, which does
  not depend on the draft: the same gradient); the project's default since its start.
- ``reverse_kl``: KL(q||p) = sum q (log q - log p).
- ``jsd``: (KL(p||m) + KL(q||m)) / 2 with m = (p + q) / 2.
- ``tv``: total variation 1 - sum min(p, q); sum min(p, q) is the acceptance rate of
  speculative sampling (Leviathan et al. 2023), so TV is one minus it.
- ``lk``: lambda KL(p||q) + (1 - lambda) TV, lambda = exp(-eta alpha) with alpha = sum min(p,
  q) not differentiated and eta = 3 (the LK hybrid: Samarin et al., "LK Losses: Direct
  Acceptance Rate Optimization for Speculative Decoding", arXiv 2602.23881; as
  vllm-project/speculators ships it).
- ``hard_ce``: cross-entropy to a label (the training sequence's next token); a label outside
  the scored vocabulary (-1) carries no loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from eagle_train.target_model import TargetFeatures
from eagle_train.target_model.frozen import head_logits, matmul_weight

LossName = Literal["forward_kl", "reverse_kl", "jsd", "tv", "lk", "hard_ce"]
LOSS_NAMES: tuple[str, ...] = get_args(LossName)
LK_ETA = 3.0  # the LK hybrid's temperature (the paper's best hybrid setting)

# fp32 elements of one chunk's [rows, vocabulary] tensor (32 MiB on CPU); a chunk holds a
# few. On CUDA 512 MiB: every chunk reads the whole head weight three times, so a chunk of
# ~1k rows keeps the matmuls compute-bound at a 128k vocabulary (not measured on a GPU yet).
CHUNK_ELEMENTS = 2**23
CUDA_CHUNK_ELEMENTS = 2**27


@dataclass(frozen=True)
class TargetRows:
    """The target's logits at each loss row, made chunk by chunk: row r is
    ``hidden[index[r]] @ weight.T + bias`` (the target's head on its final hidden state),
    rounded to the head's dtype as the head module computes it."""

    hidden: Tensor  # (M, TH) the target's final hidden states (after its final norm)
    index: Tensor  # (R,) long: the row of ``hidden`` each loss row reads
    weight: Tensor  # (V, TH) the target head's rows of the scored vocabulary, in its order
    bias: Tensor | None = None
    dtype: torch.dtype | None = None  # the head's dtype (None: the weight's)

    def logits(self, start: int, stop: int) -> Tensor:
        """(stop - start, V) fp32 logits of loss rows start..stop-1."""
        hidden = self.hidden[self.index[start:stop]]
        return head_logits(hidden, self.weight, self.bias, self.dtype or self.weight.dtype).float()


@dataclass(frozen=True)
class TargetHead:
    """The target's head over a vocabulary's rows and its final hidden states (B, T, TH):
    what the target's logits at any position are made from."""

    final: Tensor  # (B, T, TH)
    weight: Tensor  # (V, TH) in the scored vocabulary's order
    bias: Tensor | None = None

    @classmethod
    def of(cls, features: TargetFeatures, ids: Tensor | None = None) -> TargetHead:
        """The head of ``features``' target over its token ids ``ids`` (None: all)."""
        head = features.head
        bias = getattr(head, "bias", None)
        if ids is None:
            return cls(features.final, head.weight, bias)
        return cls(features.final, head.weight[ids], None if bias is None else bias[ids])

    def rows(self, rows: Tensor, positions: Tensor) -> TargetRows:
        """The target's logits at (``rows``, ``positions``), both (R,) long (the head's
        weight readied for the matmul once here: ``matmul_weight``)."""
        flat = self.final.reshape(-1, self.final.shape[-1])
        index = rows * self.final.shape[1] + positions
        return TargetRows(flat, index, matmul_weight(self.weight), self.bias, self.weight.dtype)


@dataclass
class VocabLoss:
    loss: Tensor  # scalar sum_r weights[r] * per_row[r], differentiable
    per_row: Tensor  # (R,) fp32 the menu's per-row value (no gradient)
    entropy: Tensor  # (R,) fp32 the target's entropy per row (zeros unless asked for)
    draft_argmax: Tensor  # (R,) long: the draft's argmax over the scored vocabulary
    target_argmax: Tensor  # (R,) long: the target's over the same rows (-1 without target)


def vocab_loss(
    hidden: Tensor,
    head_weight: Tensor,
    weights: Tensor,
    loss: str,
    target: TargetRows | None = None,
    labels: Tensor | None = None,
    entropy: bool = False,
    chunk_rows: int | None = None,
) -> VocabLoss:
    """``hidden`` (R, H) the draft's last hidden state at the loss rows, ``head_weight``
    (V, H) its head (the logits are ``hidden.to(head dtype) @ head_weight.T``, in fp32 after);
    ``weights`` (R,) each row's weight in the sum; ``loss`` a ``LOSS_NAMES`` entry;
    ``target`` the target's logits (every loss but hard_ce; with hard_ce only its argmax is
    read); ``labels`` (R,) long indices into the V scored tokens, -1 outside them (hard_ce);
    ``entropy``: also return the target's entropy per row (forward KL = loss - entropy)."""
    if loss not in LOSS_NAMES:
        raise ValueError(f"draft.loss {loss!r}: expected one of {', '.join(LOSS_NAMES)}")
    if loss == "hard_ce" and labels is None:
        raise ValueError("draft.loss hard_ce needs labels")
    if loss != "hard_ce" and target is None:
        raise ValueError(f"draft.loss {loss}: the target's logits are needed")
    budget = CUDA_CHUNK_ELEMENTS if hidden.device.type == "cuda" else CHUNK_ELEMENTS
    rows = max(1, chunk_rows or budget // max(head_weight.shape[0], 1))
    plan = _Plan(loss, weights.detach().float(), target, labels, entropy, rows)
    if torch.is_grad_enabled() and (hidden.requires_grad or head_weight.requires_grad):
        total, *rest = _ChunkedHeadLoss.apply(hidden, head_weight, plan)
    else:
        total, *rest = plan.run(hidden, head_weight, need_h=False, need_w=False)[:5]
    per_row, ent, draft_argmax, target_argmax = (t for t in rest if t is not None)
    return VocabLoss(total, per_row, ent, draft_argmax, target_argmax)


@dataclass
class _Plan:
    loss: str
    weights: Tensor
    target: TargetRows | None
    labels: Tensor | None
    entropy: bool
    chunk_rows: int

    def run(
        self, hidden: Tensor, weight: Tensor, need_h: bool, need_w: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
        """(loss, per_row, entropy, draft_argmax, target_argmax, d hidden, d weight): the
        gradients are those of the loss (None where not needed)."""
        n, device = hidden.shape[0], hidden.device
        per_row = torch.zeros(n, dtype=torch.float32, device=device)
        ent = torch.zeros(n, dtype=torch.float32, device=device)
        draft_argmax = torch.zeros(n, dtype=torch.long, device=device)
        target_argmax = torch.full((n,), -1, dtype=torch.long, device=device)
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=device) if need_w else None
        w = weight.detach().requires_grad_(need_w)
        for start in range(0, n, self.chunk_rows):
            stop = min(start + self.chunk_rows, n)
            with torch.set_grad_enabled(need_h or need_w):
                h = hidden[start:stop].detach().to(w.dtype).requires_grad_(need_h)
                z = F.linear(h, w)  # (n, V) in the head's dtype
                t = None if self.target is None else self.target.logits(start, stop)
                lab = None if self.labels is None else self.labels[start:stop]
                rows, h_p = _per_row(self.loss, z.float(), t, lab, self.entropy)
                chunk_total = (rows * self.weights[start:stop]).sum()
            if need_h or need_w:
                (dz,) = torch.autograd.grad(chunk_total, z)  # (n, V), the head's dtype
                if grad_h is not None:
                    grad_h[start:stop] = (dz @ w.detach()).to(hidden.dtype)
                if grad_w is not None:
                    grad_w += (dz.t() @ h.detach()).float()
            per_row[start:stop] = rows.detach()
            ent[start:stop] = h_p
            draft_argmax[start:stop] = z.detach().argmax(-1)
            if t is not None:
                target_argmax[start:stop] = t.argmax(-1)
        total = (per_row * self.weights).sum()
        return total, per_row, ent, draft_argmax, target_argmax, grad_h, grad_w


class _ChunkedHeadLoss(torch.autograd.Function):
    """Forward computes the loss and its gradients chunk by chunk (``_Plan.run``); backward
    scales the stored gradients by the incoming one."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, plan: _Plan):  # type: ignore[override]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        total, per_row, ent, draft_argmax, target_argmax, grad_h, grad_w = plan.run(
            hidden, weight, need_h, need_w
        )
        ctx.grads = (grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(per_row, ent, draft_argmax, target_argmax)
        return total, per_row, ent, draft_argmax, target_argmax

    @staticmethod
    def backward(ctx, d_total: Tensor, *unused: Tensor):  # type: ignore[override]
        grad_h, grad_w = ctx.grads
        ctx.grads = None
        dh = None if grad_h is None else grad_h * d_total.to(grad_h.dtype)
        dw = None if grad_w is None else (grad_w * d_total).to(ctx.weight_dtype)
        return dh, dw, None


def _per_row(
    loss: str, z: Tensor, t: Tensor | None, labels: Tensor | None, entropy: bool
) -> tuple[Tensor, Tensor]:
    """Per-row loss (n,) of fp32 draft logits ``z`` (n, V) and target logits ``t``, and the
    target's entropy (zeros unless ``entropy``; computed without a gradient)."""
    logq = torch.log_softmax(z, dim=-1)
    h_p = torch.zeros(z.shape[0], dtype=torch.float32, device=z.device)
    if t is not None and (entropy or loss != "hard_ce"):
        logp = torch.log_softmax(t, dim=-1)
        p = logp.exp()
        if entropy:
            h_p = -(p * logp).sum(-1).detach()
    if loss == "hard_ce":
        assert labels is not None  # vocab_loss checked it
        inside = labels >= 0
        picked = logq.gather(-1, labels.clamp(min=0)[:, None]).squeeze(-1)
        return torch.where(inside, -picked, torch.zeros_like(picked)), h_p
    if loss == "forward_kl":
        return -(p * logq).sum(-1), h_p
    q = logq.exp()
    if loss == "reverse_kl":
        return (q * (logq - logp)).sum(-1), h_p
    if loss == "jsd":
        logm = torch.logaddexp(logp, logq) - math.log(2.0)
        return 0.5 * ((p * (logp - logm)).sum(-1) + (q * (logq - logm)).sum(-1)), h_p
    overlap = torch.minimum(p, q).sum(-1)  # the acceptance rate alpha
    if loss == "tv":
        return 1.0 - overlap, h_p
    kl = (p * (logp - logq)).sum(-1)  # lk
    lam = torch.exp(-LK_ETA * overlap.detach())
    return lam * kl + (1.0 - lam) * (1.0 - overlap), h_p
