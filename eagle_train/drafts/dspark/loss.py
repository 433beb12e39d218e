"""DSpark's objective and metrics: functions of the backbone's block outputs, the draft's
heads, the sequence and the target's head and final hidden states; no module state.

Alignment: slot k (0..B-1) of the block anchored at a predicts x_{a+k+1}; its previous token
(the Markov head's input) is x_{a+k}, the anchor for slot 0 (teacher forcing: what vLLM
feeds it whenever the slots before it were accepted). The target's logits at a+k predict
x_{a+k+1}: they are the slot's target distribution p, and their argmax is what greedy
verification accepts.

Per slot: l = ce_weight * CE + tv_weight * TV(p, q), q = softmax(head(h) + Markov bias);
loss = sum(w m l) / sum(w m) + confidence_weight * sum(m BCE(c, y)) / sum(m), with w the
slot decay, m the supervised slots, c the confidence head's logit on detached inputs (it
estimates the draft, it does not shape it) and y its target (1 - TV, or greedy agreement).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from eagle_train.drafts.dflash.loss import BlockStats, _gather_positions, accuracy_metrics
from eagle_train.drafts.dspark.config import DSparkConfig
from eagle_train.drafts.dspark.model import DSparkDraft
from eagle_train.drafts.vocab_loss import TargetHead, TargetRows

# Transient fp32 logits per chunk of blocks (bytes): a few [chunk, B, V] tensors live at once.
_CHUNK_BYTES = 256 * 2**20


def vocab_terms(
    logits: Tensor, target_logits: Tensor, labels: Tensor, loss: str
) -> tuple[Tensor, Tensor]:
    """(..., V) draft logits, (..., V) target logits, (...,) data tokens -> (cross-entropy,
    total variation) per row. CE is to ``labels`` (``hard_ce``) or to softmax(target_logits)
    (``forward_kl``); TV = 1/2 sum |softmax(target) - softmax(draft)|, in [0, 1]."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    p = torch.softmax(target_logits.float(), dim=-1)
    if loss == "hard_ce":
        ce = -logq.gather(-1, labels[..., None]).squeeze(-1)
    elif loss == "forward_kl":
        ce = -(p * logq).sum(-1)
    else:
        raise ValueError(
            f"draft.loss {loss!r}: DSpark's CE term is hard_ce or forward_kl (train-draft "
            "resolves auto from the training data before the first step)"
        )
    tv = 0.5 * (p - logq.exp()).abs().sum(-1)
    return ce, tv


@dataclass
class DSparkStats(BlockStats):
    ce: Tensor  # (Bt, N, B) per-slot cross-entropy (detached)
    tv: Tensor  # (Bt, N, B) per-slot total variation (detached)
    confidence: Tensor | None  # (Bt, N, B) sigmoid of the confidence head (detached)
    confidence_loss: Tensor  # scalar, the mean BCE over supervised slots (detached)


def dspark_loss(
    draft: DSparkDraft,
    hidden: Tensor,
    input_ids: Tensor,
    target: TargetHead,
    anchors: Tensor,
    mask: Tensor,
    weights: Tensor,
    cfg: DSparkConfig,
    chunk_bytes: int = _CHUNK_BYTES,
) -> DSparkStats:
    """``hidden`` (Bt, N, B, H) backbone outputs of every slot, ``target`` the target's head
    and final hidden states, ``mask`` (Bt, N, B) supervised slots, ``weights`` (B,) slot
    decay. Blocks go through the heads in chunks recomputed in backward: one chunk's (.., V)
    tensors live at a time, the target's logits of the chunk's slots among them (made from
    its final hidden states: the target's [tokens, vocabulary] logits never exist)."""
    bt, n, block, _ = hidden.shape
    length = input_ids.shape[1]
    k = torch.arange(block, device=anchors.device)
    # Padding blocks may run past the end: clamp (their mask is 0).
    prev_pos = (anchors[..., None] + k).clamp(max=length - 1)  # (Bt, N, B)
    rows = torch.arange(bt, device=anchors.device)[:, None, None].expand_as(prev_pos)
    w = weights.to(hidden.device)[None, None, :] * mask
    m = mask.float()
    # Blocks flattened (Bt * N, B, ...): a chunk of blocks is a run of the target's rows.
    flat = [
        x.reshape(bt * n, block, *x.shape[3:])
        for x in (
            hidden,
            _gather_positions(input_ids, prev_pos),
            _gather_positions(input_ids, (prev_pos + 1).clamp(max=length - 1)),
            w,
            m,
        )
    ]
    chunk = max(1, chunk_bytes // (4 * 4 * block * draft.vocab_size))
    terms = _ChunkTerms(draft, target.rows(rows.reshape(-1), prev_pos.reshape(-1)), cfg)
    dist_sum = hidden.new_zeros((), dtype=torch.float32)
    conf_sum = hidden.new_zeros((), dtype=torch.float32)
    parts: list[tuple[Tensor, ...]] = []
    for start in range(0, bt * n, chunk):
        args = (start, *(x[start : start + chunk] for x in flat))
        if torch.is_grad_enabled() and hidden.requires_grad:
            out = checkpoint(terms, *args, use_reentrant=False)
        else:
            out = terms(*args)
        dist_sum = dist_sum + out[0]
        conf_sum = conf_sum + out[1]
        parts.append(tuple(t.detach() for t in out[2:]))
    argmax, target_argmax, ce, tv, conf = (
        torch.cat([p[i] for p in parts]).view(bt, n, block) for i in range(5)
    )
    conf_loss = conf_sum / m.sum().clamp(min=1.0)
    loss = dist_sum / w.sum().clamp(min=1e-6)
    if draft.confidence_head is not None and cfg.confidence_weight > 0:
        loss = loss + cfg.confidence_weight * conf_loss
    return DSparkStats(
        loss=loss,
        correct=argmax == target_argmax,
        mask=mask,
        ce=ce,
        tv=tv,
        confidence=conf if draft.confidence_head is not None else None,
        confidence_loss=conf_loss.detach(),
    )


class _ChunkTerms:
    """A chunk's weighted sums (distribution terms, confidence BCE) and its per-slot draft
    and target argmax, CE, TV and confidence (re-run by checkpoint in backward)."""

    def __init__(self, draft: DSparkDraft, target: TargetRows, cfg: DSparkConfig) -> None:
        self.draft, self.target, self.cfg = draft, target, cfg

    def __call__(
        self, start: int, hidden: Tensor, prev: Tensor, labels: Tensor, w: Tensor, m: Tensor
    ) -> tuple[Tensor, ...]:
        """Blocks start.. of the flattened blocks: ``hidden`` (C, B, H), the rest (C, B)."""
        cfg, draft = self.cfg, self.draft
        block = prev.shape[1]
        with torch.no_grad():  # the target is frozen
            target = self.target.logits(start * block, (start + prev.shape[0]) * block)
        target = target.view(*prev.shape, -1)
        logits, embedding = draft.slot_logits(hidden, prev)
        ce, tv = vocab_terms(logits, target, labels, cfg.loss)
        dist = (w * (cfg.ce_weight * ce + cfg.tv_weight * tv)).sum()
        argmax, target_argmax = logits.argmax(-1), target.argmax(-1)
        if draft.confidence_head is None:
            zero = dist.new_zeros(())
            return dist, zero, argmax, target_argmax, ce, tv, torch.zeros_like(tv)
        c = draft.confidence_logit(hidden.detach(), embedding.detach())
        if cfg.confidence_target == "tv":
            y = 1.0 - tv.detach()
        else:
            y = (argmax == target_argmax).float()
        bce = F.binary_cross_entropy_with_logits(c, y.clamp(0.0, 1.0), reduction="none")
        return dist, (m * bce).sum(), argmax, target_argmax, ce, tv, torch.sigmoid(c)


def dspark_metrics(stats: DSparkStats) -> dict[str, float]:
    """acc_k and sim_accept_len (DFlash's definitions over B slots), the mean CE and TV of the
    supervised slots, and the confidence head's BCE and mean estimate."""
    out = accuracy_metrics(stats)
    m = stats.mask
    count = m.sum().clamp(min=1)
    out["ce"] = float((stats.ce * m).sum() / count)
    out["tv"] = float((stats.tv * m).sum() / count)
    if stats.confidence is not None:
        out["confidence_bce"] = float(stats.confidence_loss)
        out["confidence_mean"] = float((stats.confidence * m).sum() / count)
    return out
