"""The settings every draft algorithm's config shares (declared once, here)."""

from __future__ import annotations

from pathlib import Path

from eagle_train.config import StrictModel
from eagle_train.drafts.vocab_loss import LossName

# The most tokens a draft may be trained to propose per step (ttt_steps, parallel_steps,
# block_size - 1, num_speculative_tokens) and the most layers it may have: activation memory
# grows with each (ttt_steps=100000 grew without end), and acceptance beyond a few tens of
# tokens is nil, so a larger value is refused when the config is read, before any training.
MAX_DRAFT_DEPTH = 64


class DraftConfigBase(StrictModel):
    init_from: Path | None = None
    """Warm start: a drafter directory to continue training from, in any layout vLLM serves for
    this algorithm (export-draft's native or speculators format, or SafeAILab's config.json +
    midlayer.* tensors + d2t/t2d). Checked against the target and this config before
    training; the optimizer starts fresh. Its draft vocabulary is kept unless
    draft.draft_vocab_size asks for another size (then head rows move by target id and the
    others start from the target's head). Read on a fresh run only, never on resume."""


class VocabLossChoice(StrictModel):
    """``draft.loss``: the loss over the vocabulary (drafts/vocab_loss.py; docs/training.md,
    "The loss menu"): forward_kl (soft cross-entropy to the target's distribution, the
    default), reverse_kl, jsd, tv (total variation), lk (the LK hybrid of KL and TV) or
    hard_ce (cross-entropy to the training sequence's next token)."""

    loss: LossName = "forward_kl"
    """The loss over the vocabulary: forward_kl (today's and the papers' choice), reverse_kl,
    jsd, tv, lk or hard_ce, each computed in chunks with no [tokens, vocabulary] tensor kept
    for backward (drafts/vocab_loss.py; docs/training.md, "The loss menu")."""


class FusionNorms(StrictModel):
    """EAGLE-3.1's norms before fc (vLLM's drafter config switches of the same names, all
    false: EAGLE-3), for the drafts that fuse the target's aux features with fc."""

    norm_before_fc: bool = False
    """EAGLE-3.1: one RMSNorm over the concatenated aux features before fc (tensor input_norm).
    """
    fc_norm: bool = False
    """EAGLE-3.1: one RMSNorm per aux layer's chunk of the features before fc (tensors
    fc_norm.i)."""
