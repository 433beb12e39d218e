"""EAGLE-1 as the loop sees it: no aux layers (the final-normed hidden only), build, loss,
export."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from eagle_train.data.loader import Batch
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.base import StepResult, VllmDrafter
from eagle_train.drafts.common import DecoderDims, layer_shape
from eagle_train.drafts.eagle1 import export
from eagle_train.drafts.eagle1.config import Eagle1Config
from eagle_train.drafts.eagle1.loss import eagle1_loss
from eagle_train.drafts.eagle1.model import Eagle1Draft
from eagle_train.drafts.eagle_family import DraftShape, set_backend, shift_left, valid_slots
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.memory_plan import DraftActivations
from eagle_train.target_model import FrozenTarget, TargetDescription, TargetFeatures
from eagle_train.target_model.description import Capability

# Keys only EAGLE-3-family or DFlash drafters write; a plain Llama config has none of them.
_OTHER_FORMATS = (
    "eagle_aux_hidden_state_layer_ids",
    "num_aux_hidden_states",
    "draft_vocab_size",
    "parallel_drafting",
    "dflash_config",
)


class Eagle1Spec:
    name = "eagle1"
    config_cls = Eagle1Config
    vllm_method = "eagle"
    target_needs: Capability = "last_hidden_state"
    uses_draft_vocab = False
    gpu_only: str | None = None

    def served_tokens(self, config: dict[str, Any]) -> int | None:
        """vLLM's num_speculative_tokens is a serving choice: the config does not say."""
        return None

    def recognizes(self, config: dict[str, Any]) -> bool:
        archs = config.get("architectures") or []
        return not any(key in config for key in _OTHER_FORMATS) and any(
            a in ("LlamaForCausalLM", "EagleLlamaForCausalLM") for a in archs
        )

    def target_layer_ids(self, cfg: Eagle1Config, target: TargetDescription) -> list[int]:
        return []  # EAGLE-1 reads TargetFeatures.final (after the final norm) only

    def build(
        self, cfg: Eagle1Config, target: FrozenTarget, vocab: VocabMapping | None
    ) -> Eagle1Draft:
        # The draft predicts features for the target's own head: the full target vocab,
        # whatever draft vocabulary the data preparation computed.
        desc = target.description
        # vLLM's EAGLE-1 drafter is Llama-style whatever the target: no q/k norm.
        shape = DraftShape.from_target(
            desc, num_aux=1, draft_vocab_size=desc.vocab_size, qk_norm=False
        )
        draft = Eagle1Draft(shape, desc, cfg.num_layers).float()
        set_backend(draft, cfg.attention)
        with torch.no_grad():
            draft.embed_tokens.weight.copy_(target.embed_tokens().weight.float())
            draft.lm_head.weight.copy_(target.lm_head().weight.float())
        draft.embed_tokens.weight.requires_grad_(False)
        draft.lm_head.weight.requires_grad_(False)
        return draft

    def compute_loss(
        self, draft: nn.Module, features: TargetFeatures, batch: Batch, cfg: Eagle1Config
    ) -> StepResult:
        module = getattr(draft, "module", draft)  # DDP-wrapped or not
        feature = features.final.to(module.fc.weight.dtype)
        if module.training and cfg.feature_noise > 0:
            feature = feature + (torch.rand_like(feature) * 2 - 1) * cfg.feature_noise
        (pred,) = draft(feature, batch.input_ids, 1)
        mask = valid_slots(batch.loss_mask, batch.lengths, 0)
        out = eagle1_loss(
            pred,
            module.lm_head.weight,
            shift_left(features.final, 1),
            TargetHead.of(features),
            batch.input_ids,
            mask,
            cfg.feature_weight,
            cfg.logit_weight,
            cfg.loss,
        )
        n = int(mask.sum())
        metrics = {
            "loss": out.loss.item(),
            "loss_feature": out.feature.item(),
            "loss_logit": out.logit.item(),
            "acc_0": (out.correct & mask).sum().item() / max(n, 1),
        }
        return StepResult(loss=out.loss, metrics=metrics, weight=n)

    def activations(
        self, cfg: Eagle1Config, target: TargetDescription, tokens: int, rows: int
    ) -> DraftActivations:
        """Every token once through fc and the layers (no training-time test)."""
        return DraftActivations(
            units=tokens,
            layer=layer_shape(DecoderDims.from_target(target), qk_norm=False),
            num_layers=cfg.num_layers,
            first_input=target.hidden_size,
            first_norms=1,
            per_token=3 * target.hidden_size,  # fc's [embedding, feature] and the regressed one
            what=f"draft.num_layers={cfg.num_layers}",
        )

    @torch.no_grad()
    def propose(
        self,
        draft: nn.Module,
        features: TargetFeatures,
        input_ids: Tensor,
        cfg: Eagle1Config,
        num_steps: int,
    ) -> Tensor:
        preds = draft(features.final.to(draft.fc.weight.dtype), input_ids, num_steps)
        return torch.stack([draft.lm_head(p).argmax(-1) for p in preds], dim=-1)

    def to_vllm(
        self, state: dict[str, Tensor], cfg: Eagle1Config, target: TargetDescription
    ) -> VllmDrafter:
        return export.to_vllm(state, cfg, target)

    def expected_tensors(
        self, config: dict[str, Any]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        return export.expected_tensors(config)

    def from_speculators(self, config: dict[str, Any]) -> dict[str, Any] | None:
        return None  # vLLM reads no speculators-format drafter of this type

    def import_tensors(
        self, tensors: dict[str, Tensor], config: dict[str, Any]
    ) -> dict[str, Tensor]:
        return export.import_tensors(tensors, config)
