"""DFlash as the loop sees it: layer ids, build, loss, offline proposals, export; and what the
block drafts (DFlash, DSpark) share, ``BlockSpec``."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from eagle_train.data.loader import Batch
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.base import StepResult, VllmDrafter
from eagle_train.drafts.dflash import export
from eagle_train.drafts.dflash.blocks import (
    Anchors,
    block_activations,
    loss_gamma,
    sample_anchors,
    select_layer_ids,
    slot_mask,
    slot_weights,
)
from eagle_train.drafts.dflash.config import DFlashConfig
from eagle_train.drafts.dflash.loss import accuracy_metrics, dflash_loss
from eagle_train.drafts.dflash.model import DFlashDraft, DFlashShape
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.memory_plan import DraftActivations
from eagle_train.target_model import FrozenTarget, TargetDescription, TargetFeatures
from eagle_train.target_model.description import Capability

# Validation scores the same anchors at every evaluation (and leaves the training RNG alone).
_VALIDATION_SEED = 0


class BlockSpec:
    """What the block drafts share: the target layers they read, their shape, their anchors,
    their activations' plan and the delegation to their export module (``export``)."""

    target_needs: Capability = "aux_hidden_states"
    uses_draft_vocab = False
    export: ModuleType  # to_vllm, expected_tensors, from_speculators

    def layer_ids(self, cfg: DFlashConfig, target: TargetDescription) -> list[int]:
        """0-based target layer outputs (DFlash's convention, written to config.json)."""
        return select_layer_ids(cfg.target_layer_ids, cfg.num_target_features, target.num_layers)

    def target_layer_ids(self, cfg: DFlashConfig, target: TargetDescription) -> list[int]:
        # the loop's "after k layers" convention: output of 0-based layer i = after i+1
        return [i + 1 for i in self.layer_ids(cfg, target)]

    def shape(self, cfg: DFlashConfig, target: TargetDescription) -> DFlashShape:
        return DFlashShape.from_target(
            target,
            num_features=len(self.layer_ids(cfg, target)),
            num_layers=cfg.num_layers,
            block_size=cfg.block_size,
            mask_token_id=export.resolve_mask_token_id(cfg, target),
        )

    def anchors(self, draft: nn.Module, batch: Batch, cfg: DFlashConfig, span: int) -> Anchors:
        """Up to ``num_anchors`` blocks of ``span`` positions per row, from the torch RNG in
        training; validation scores the same anchors at every evaluation (and leaves the
        training RNG alone)."""
        generator = None
        if not draft.training:
            generator = torch.Generator(batch.input_ids.device).manual_seed(_VALIDATION_SEED)
        return sample_anchors(batch.loss_mask, batch.lengths, span, cfg.num_anchors, generator)

    def activations(
        self, cfg: DFlashConfig, target: TargetDescription, tokens: int, rows: int
    ) -> DraftActivations:
        return block_activations(cfg, target, tokens, rows, len(self.layer_ids(cfg, target)))

    def to_vllm(
        self, state: dict[str, Tensor], cfg: DFlashConfig, target: TargetDescription
    ) -> VllmDrafter:
        return self.export.to_vllm(state, cfg, target, self.layer_ids(cfg, target))

    def expected_tensors(
        self, config: dict[str, Any]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        return self.export.expected_tensors(config)

    def from_speculators(self, config: dict[str, Any]) -> dict[str, Any] | None:
        return self.export.from_speculators(config)

    def import_tensors(
        self, tensors: dict[str, Tensor], config: dict[str, Any]
    ) -> dict[str, Tensor]:
        # both exports filter the state dict: the inverse is the identity
        return export.import_tensors(tensors, config)


class DFlashSpec(BlockSpec):
    name = "dflash"
    config_cls = DFlashConfig
    vllm_method = "dflash"
    export = export
    gpu_only: str | None = None

    def served_tokens(self, config: dict[str, Any]) -> int | None:
        """vLLM drafts block_size - 1 tokens (the block's first slot is the anchor)."""
        return block - 1 if isinstance(block := config.get("block_size"), int) else None

    def recognizes(self, config: dict[str, Any]) -> bool:
        archs = config.get("architectures") or []
        return "dflash_config" in config or any("DFlash" in a for a in archs)

    def build(
        self, cfg: DFlashConfig, target: FrozenTarget, vocab: VocabMapping | None
    ) -> DFlashDraft:
        # `vocab` is unused: the draft predicts over the target's full vocabulary with the
        # target's own head (vLLM's DFlash shares it), so there is no draft vocabulary.
        desc = target.description
        shape = self.shape(cfg, desc)
        draft = DFlashDraft(shape, desc, target.embed_tokens(), target.lm_head()).float()
        for layer in draft.layers:
            layer.self_attn.backend = cfg.attention
        return draft

    def compute_loss(
        self, draft: nn.Module, features: TargetFeatures, batch: Batch, cfg: DFlashConfig
    ) -> StepResult:
        module = getattr(draft, "module", draft)  # DDP-wrapped or not
        anchors = self.anchors(module, batch, cfg, cfg.block_size)
        hidden = draft(features.aux, batch.input_ids, anchors.positions)
        weights = slot_weights(cfg.block_size, loss_gamma(cfg.block_size, cfg.loss_gamma))
        # slot 0 holds the anchor: nothing to predict there
        # hard labels need the target's greedy tokens alone: with a format-2 feature cache
        # the target's head never runs
        stats = dflash_loss(
            hidden[:, :, 1:],
            module.head_weight,
            batch.input_ids,
            features.greedy,
            None if cfg.loss == "hard_ce" else TargetHead.of(features),
            anchors.positions,
            slot_mask(batch.loss_mask, anchors.positions, anchors.valid, cfg.block_size),
            weights,
            cfg.loss,
        )
        metrics = {"loss": stats.loss.item(), **accuracy_metrics(stats)}
        return StepResult(loss=stats.loss, metrics=metrics, weight=int(anchors.valid.sum()))

    @torch.no_grad()
    def propose(
        self,
        draft: nn.Module,
        features: TargetFeatures,
        input_ids: Tensor,
        cfg: DFlashConfig,
        num_steps: int,
    ) -> Tensor:
        """Entry [t, k] = slot k+1 of the block anchored at x_{t+1}: context <= t, exactly
        what vLLM drafts once x_{t+1} is the last accepted token. DFlash does not chain:
        the whole block comes from one forward, so no proposal depends on another."""
        if num_steps > cfg.block_size - 1:
            raise ValueError(
                f"a DFlash block of {cfg.block_size} proposes at most "
                f"{cfg.block_size - 1} tokens, asked for {num_steps}"
            )
        bt, length = input_ids.shape
        # Anchor t+1 for t = 0..T-2; slot T-1 has no next token (its row repeats the last).
        anchors = torch.arange(1, max(length, 2), device=input_ids.device)
        anchors = anchors.clamp(max=length - 1).expand(bt, -1)
        hidden = draft(features.aux, input_ids, anchors)
        ids = draft.logits(hidden[:, :, 1 : 1 + num_steps]).argmax(-1)  # (Bt, T-1, K)
        return torch.cat([ids, ids[:, -1:]], dim=1)[:, :length]
