"""The settings every draft algorithm's config shares (declared once, here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle_train.config import StrictModel, refuse_moved_key
from eagle_train.drafts.vocab_loss import LossName


class DraftConfigBase(StrictModel):
    # Warm start: a drafter directory to continue training from, in any layout vLLM serves
    # for this algorithm (export-draft's native or speculators format, or SafeAILab's
    # config.json + midlayer.* tensors + d2t/t2d). Checked against the target and this
    # config before training; the optimizer starts fresh. Its draft vocabulary is kept unless
    # draft.draft_vocab_size asks for another size (then head rows move by target id and the
    # others start from the target's head). Read on a fresh run only, never on resume.
    init_from: Path | None = None


class VocabLossChoice(StrictModel):
    """``draft.loss``: the loss over the vocabulary (drafts/vocab_loss.py; docs/training.md,
    "The loss menu"): forward_kl (soft cross-entropy to the target's distribution, the
    default), reverse_kl, jsd, tv (total variation), lk (the LK hybrid of KL and TV) or
    hard_ce (cross-entropy to the training sequence's next token)."""

    loss: LossName = "forward_kl"


class FusionNorms(StrictModel):
    """EAGLE-3.1's norms before fc (vLLM's drafter config switches of the same names, all
    false: EAGLE-3), for the drafts that fuse the target's aux features with fc."""

    # One RMSNorm over the concatenated aux features before fc (tensor input_norm):
    norm_before_fc: bool = False
    # One RMSNorm per aux layer's chunk of the features before fc (tensors fc_norm.i):
    fc_norm: bool = False


def refuse_layer_style(data: Any) -> Any:
    """For the ``mode="before"`` validator of a draft config with ``qk_norm``: the old
    ``layer_style`` key (family names for the q/k norm switch) is refused in one line."""
    return refuse_moved_key(
        data,
        "layer_style",
        "draft.layer_style moved to draft.qk_norm (qwen3 is qk_norm: true, llama is "
        "qk_norm: false, auto is leaving it unset): set it there",
    )
