"""The settings every draft algorithm's config shares (declared once, here)."""

from __future__ import annotations

from pathlib import Path

from eagle_train.config import StrictModel


class DraftConfigBase(StrictModel):
    init_from: Path | None = None
    """Warm start: a drafter directory to continue training from, in any layout vLLM serves for
    this algorithm (export-draft's native or speculators format, or SafeAILab's config.json +
    midlayer.* tensors + d2t/t2d). Checked against the target and this config before
    training; the optimizer starts fresh. Its draft vocabulary is kept unless
    draft.draft_vocab_size asks for another size (then head rows move by target id and the
    others start from the target's head). Read on a fresh run only, never on resume."""


class FusionNorms(StrictModel):
    """EAGLE-3.1's norms before fc (vLLM's drafter config switches of the same names, all
    false: EAGLE-3), for the drafts that fuse the target's aux features with fc."""

    norm_before_fc: bool = False
    """EAGLE-3.1: one RMSNorm over the concatenated aux features before fc (tensor input_norm).
    """
    fc_norm: bool = False
    """EAGLE-3.1: one RMSNorm per aux layer's chunk of the features before fc (tensors
    fc_norm.i)."""
