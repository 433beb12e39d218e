"""EAGLE-3 as the loop sees it: layer ids, build, loss, export."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from eagle_train.config import ConfigError
from eagle_train.data.loader import Batch
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.base import StepResult, VllmDrafter
from eagle_train.drafts.common import DecoderDims, layer_shape
from eagle_train.drafts.cycles import cycle_metrics
from eagle_train.drafts.eagle3 import export
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.eagle3.copy_loss import copy_attention_loss
from eagle_train.drafts.eagle3.loss import accuracy_metrics, eagle3_loss, supervised_slots
from eagle_train.drafts.eagle3.model import Eagle3Draft
from eagle_train.drafts.eagle_family import (
    DraftShape,
    aux_layer_ids,
    draft_ids,
    draft_qk_norm,
    set_backend,
)
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.memory_plan import DraftActivations
from eagle_train.target_model import FrozenTarget, TargetDescription, TargetFeatures
from eagle_train.target_model.description import Capability


class Eagle3Spec:
    name = "eagle3"
    config_cls = Eagle3Config
    vllm_method = "eagle3"
    target_needs: Capability = "aux_hidden_states"
    uses_draft_vocab = True
    gpu_only: str | None = None

    def served_tokens(self, config: dict[str, Any]) -> int | None:
        """vLLM's num_speculative_tokens is a serving choice: the config does not say."""
        return None

    def recognizes(self, config: dict[str, Any]) -> bool:
        archs = config.get("architectures") or []
        # vLLM's speculators loader gives DFlash eagle_aux_hidden_state_layer_ids too
        return (
            not config.get("parallel_drafting")
            and "dflash_config" not in config
            and (
                "eagle_aux_hidden_state_layer_ids" in config
                or "num_aux_hidden_states" in config
                or any(a.startswith("Eagle3") or a.endswith("Eagle3") for a in archs)
            )
        )

    def target_layer_ids(self, cfg: Eagle3Config, target: TargetDescription) -> list[int]:
        return aux_layer_ids(cfg.aux_layer_ids, target)

    def build(
        self, cfg: Eagle3Config, target: FrozenTarget, vocab: VocabMapping | None
    ) -> Eagle3Draft:
        desc = target.description
        kv_heads = cfg.num_kv_heads or desc.num_kv_heads
        if desc.num_heads % kv_heads:
            raise ConfigError(
                f"draft.num_kv_heads: a divisor of the target's {desc.num_heads} attention "
                f"heads, got {kv_heads}"
            )
        if cfg.copy_heads > kv_heads:
            raise ConfigError(
                f"draft.copy_heads: at most the draft's {kv_heads} key/value heads (one copy "
                f"head per group), got {cfg.copy_heads}"
            )
        vd = len(vocab.d2t) if vocab is not None else desc.vocab_size
        shape = DraftShape.from_target(
            desc,
            num_aux=len(self.target_layer_ids(cfg, desc)),
            draft_vocab_size=vd,
            qk_norm=draft_qk_norm(cfg.qk_norm, desc),
            num_kv_heads=kv_heads,
        )
        draft = Eagle3Draft(shape, desc, cfg).float()
        set_backend(draft, cfg.attention)
        with torch.no_grad():
            draft.embed_tokens.weight.copy_(target.embed_tokens().weight.float())
            if vocab is not None:
                draft.d2t.copy_(vocab.d2t)
                draft.t2d.copy_(vocab.t2d)
            # Start the head from the target's rows of the draft vocabulary: the draft then
            # begins near the target's own next-token distribution.
            draft.lm_head.weight.copy_(target.lm_head().weight[draft_ids(draft)].float())
        draft.embed_tokens.weight.requires_grad_(cfg.train_embedding)
        return draft

    def compute_loss(
        self, draft: nn.Module, features: TargetFeatures, batch: Batch, cfg: Eagle3Config
    ) -> StepResult:
        module = getattr(draft, "module", draft)  # DDP-wrapped or not
        copy_steps = cfg.copy_steps if cfg.copy_supervision > 0 else 0
        aux = features.aux.to(module.fc.weight.dtype)
        head_at = supervised_slots(batch.loss_mask, batch.lengths, cfg.ttt_steps)
        out = draft(aux, batch.input_ids, cfg.ttt_steps, copy_steps, head_at, head=False)
        stats = eagle3_loss(
            out.hidden,
            module.lm_head.weight,
            TargetHead.of(features, draft_ids(module)),
            features.greedy,
            len(module.t2d),  # the target's vocabulary size
            batch.loss_mask,
            batch.lengths,
            module.d2t,
            cfg.step_decay,
            cfg.drop_out_of_vocab,
            cfg.loss,
            batch.input_ids,
        )
        metrics = {"loss": stats.loss.item(), **accuracy_metrics(stats)}
        metrics.update(cycle_metrics(stats.correct, stats.valid, batch.loss_mask, batch.lengths))
        for k, value in enumerate(stats.step_losses):
            metrics[f"loss_{k}"] = value
        loss = stats.loss
        if out.copy_qk:
            copied = copy_attention_loss(
                out.copy_qk, batch.input_ids, batch.loss_mask, batch.lengths
            )
            loss = loss + cfg.copy_supervision * copied.loss
            metrics["copy_loss"] = copied.loss.item()
            for k, mass in enumerate(copied.mass):  # copy_attention: step 0, then _1, _2, ..
                metrics["copy_attention" + (f"_{k}" if k else "")] = mass
        return StepResult(loss=loss, metrics=metrics, weight=int(stats.valid[0].sum()))

    def activations(
        self, cfg: Eagle3Config, target: TargetDescription, tokens: int, rows: int
    ) -> DraftActivations:
        """Every token through the fused layer (and the later ones) at each TTT step."""
        dims = DecoderDims.from_target(target, num_kv_heads=cfg.num_kv_heads or target.num_kv_heads)
        return DraftActivations(
            units=tokens * cfg.ttt_steps,
            layer=layer_shape(dims, draft_qk_norm(cfg.qk_norm, target)),
            num_layers=cfg.num_layers,
            first_input=2 * target.hidden_size,
            first_norms=2,
            per_token=len(self.target_layer_ids(cfg, target)) * target.hidden_size,
            what=f"draft.ttt_steps={cfg.ttt_steps}",
        )

    @torch.no_grad()
    def propose(
        self,
        draft: nn.Module,
        features: TargetFeatures,
        input_ids: Tensor,
        cfg: Eagle3Config,
        num_steps: int,
    ) -> Tensor:
        out = draft(features.aux.to(draft.fc.weight.dtype), input_ids, num_steps)
        ids = draft_ids(draft)
        return torch.stack([ids[logits.argmax(-1)] for logits in out.logits], dim=-1)

    def to_vllm(
        self, state: dict[str, Tensor], cfg: Eagle3Config, target: TargetDescription
    ) -> VllmDrafter:
        return export.to_vllm(state, cfg, target, self.target_layer_ids(cfg, target))

    def expected_tensors(
        self, config: dict[str, Any]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        return export.expected_tensors(config)

    def from_speculators(self, config: dict[str, Any]) -> dict[str, Any] | None:
        return export.from_speculators(config)

    def import_tensors(
        self, tensors: dict[str, Tensor], config: dict[str, Any]
    ) -> dict[str, Tensor]:
        return export.import_tensors(tensors, config)
