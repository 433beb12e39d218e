"""DSpark draft config (every default lives here): DFlash's settings plus the Markov head,
the confidence head and the weights of DSpark's objective."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eagle_train.drafts.dflash.config import DFlashConfig
from eagle_train.drafts.draft_config import MAX_DRAFT_DEPTH


class DSparkConfig(DFlashConfig):
    algorithm: Literal["dspark"] = "dspark"  # type: ignore[assignment]
    """The draft algorithm: eagle1, eagle3, peagle, dflash or dspark (docs/algorithms/); it
    picks which draft.* settings exist."""
    block_size: int = Field(default=7, ge=2, le=MAX_DRAFT_DEPTH)
    """Block = [anchor, NOISE x (B-1)]; every slot predicts (slot k: x_{a+k+1}), so vLLM serves
    it with num_speculative_tokens = B (DeepSpec's published drafters: B = 7)."""
    markov_rank: int = Field(default=256, ge=1)
    """Rank r of the Markov head: logits_k += W2 @ W1[previous token] (W1, W2: V x r). At most
    the draft's hidden size (checked where the target is known)."""
    confidence_head: bool = True
    """The confidence head: sigmoid(w . [h_k, W1[prev]] + b), an estimate of slot k's
    acceptance given the slots before it were accepted (vLLM's adaptive verification reads
    it)."""
    confidence_with_markov: bool = True
    """Whether the confidence head also reads the Markov embedding W1[prev] (vLLM's
    confidence_head_with_markov; DeepSpec's published drafters: true)."""
    ce_weight: float = Field(default=0.1, ge=0)
    """Weight of the cross-entropy term of DSpark's objective per slot: ce_weight x CE +
    tv_weight x TV(p_target, q_draft) + confidence_weight x BCE (DeepSpec's 0.1 / 0.9 / 1.0).
    The CE follows draft.loss: hard_ce (the data token) or forward_kl (the target's
    distribution); auto picks one from the training data."""
    tv_weight: float = Field(default=0.9, ge=0)
    """Weight of the total variation between the target's and the draft's distributions."""
    confidence_weight: float = Field(default=1.0, ge=0)
    """Weight of the confidence head's binary cross-entropy (0: the head is not trained)."""
    confidence_target: Literal["tv", "greedy"] = "tv"
    """What the confidence head learns: tv = 1 - TV(p, q), the probability that sampling
    verification accepts the slot's draft (DeepSpec's); greedy = 1 when the draft's argmax is
    the target's (what greedy verification accepts)."""
    loss_gamma: float | None = Field(default=4.0, gt=0)
    """Slot k (0..B-1) weighs exp(-k/gamma); DeepSpec's published value 4 (DFlash's table is
    for its B-1 masked slots, so it is set here)."""

    @model_validator(mode="after")
    def _some_loss(self) -> DSparkConfig:
        if self.ce_weight == 0 and self.tv_weight == 0:
            raise ValueError(
                "draft.ce_weight and draft.tv_weight are both 0: the draft's distribution "
                "would not be trained; set one of them above 0"
            )
        if self.loss not in ("auto", "hard_ce", "forward_kl"):
            raise ValueError(
                f"draft.loss {self.loss}: DSpark's objective is CE + TV by definition; its CE "
                "term is hard_ce or forward_kl (or auto)"
            )
        if self.confidence_weight > 0 and not self.confidence_head:
            raise ValueError(
                "draft.confidence_weight > 0 with draft.confidence_head false: set "
                "draft.confidence_weight: 0 or draft.confidence_head: true"
            )
        return self
