"""P-EAGLE as the loop sees it: layer ids, build, loss (one pass or in anchor segments),
export."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoTokenizer

from eagle_train.data.loader import Batch
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.base import StepResult, VllmDrafter
from eagle_train.drafts.common import DecoderDims, layer_shape
from eagle_train.drafts.eagle_family import DraftShape, aux_layer_ids, draft_ids, draft_qk_norm
from eagle_train.drafts.peagle import export
from eagle_train.drafts.peagle.config import PEagleConfig
from eagle_train.drafts.peagle.loss import depth_metrics, peagle_loss
from eagle_train.drafts.peagle.model import PEagleDraft
from eagle_train.drafts.peagle.sampling import (
    Elements,
    keep_fractions,
    sample_elements,
    segment_grids,
    supervision,
)
from eagle_train.drafts.vocab_loss import TargetHead
from eagle_train.memory_plan import DraftActivations
from eagle_train.target_model import FrozenTarget, TargetDescription, TargetFeatures
from eagle_train.target_model.description import Capability


class PEagleSpec:
    name = "peagle"
    config_cls = PEagleConfig
    vllm_method = "eagle3"
    target_needs: Capability = "aux_hidden_states"
    uses_draft_vocab = True
    gpu_only: str | None = None

    def served_tokens(self, config: dict[str, Any]) -> int | None:
        """vLLM's num_speculative_tokens is a serving choice: the config does not say."""
        return None

    def recognizes(self, config: dict[str, Any]) -> bool:
        return bool(config.get("parallel_drafting")) and "mask_token_id" in config

    def target_layer_ids(self, cfg: PEagleConfig, target: TargetDescription) -> list[int]:
        return aux_layer_ids(cfg.aux_layer_ids, target)

    def build(
        self, cfg: PEagleConfig, target: FrozenTarget, vocab: VocabMapping | None
    ) -> PEagleDraft:
        desc = target.description
        mask_id = resolve_mask_token_id(cfg, target)
        vd = len(vocab.d2t) if vocab is not None else desc.vocab_size
        shape = DraftShape.from_target(
            desc,
            num_aux=len(self.target_layer_ids(cfg, desc)),
            draft_vocab_size=vd,
            qk_norm=draft_qk_norm(cfg.qk_norm, desc),
        )
        draft = PEagleDraft(shape, desc, cfg).float()
        draft.attention = cfg.attention
        with torch.no_grad():
            embed = target.embed_tokens().weight.float()
            draft.embed_tokens.weight.copy_(embed)
            draft.mask_embedding.copy_(embed[mask_id])
            draft.mask_token_id.fill_(mask_id)
            if vocab is not None:
                draft.d2t.copy_(vocab.d2t)
                draft.t2d.copy_(vocab.t2d)
            draft.lm_head.weight.copy_(target.lm_head().weight[draft_ids(draft)].float())
        draft.embed_tokens.weight.requires_grad_(False)  # only the mask row trains
        return draft

    def loss_parts(
        self,
        draft: nn.Module,
        features: TargetFeatures,
        batch: Batch,
        cfg: PEagleConfig,
        num_segments: int | None = None,
    ) -> list[Callable[[], StepResult]]:
        """One thunk per anchor segment; sampling happens here, once. Each thunk's loss is
        already divided by the micro-batch's total supervised count."""
        module = getattr(draft, "module", draft)  # DDP-wrapped or not
        k = cfg.parallel_steps
        supervised = supervision(batch.loss_mask, batch.lengths, k)
        # Validation (eval mode) computes every depth of every anchor: exact metrics, no
        # sampling noise between evaluations.
        keep = keep_fractions(k, cfg.keep_ratio, cfg.min_keep_ratio) if module.training else None
        grid = sample_elements(batch.lengths, batch.input_ids.shape[1], k, supervised, keep)
        aux = features.aux.to(module.fc.weight.dtype)
        ids = draft_ids(module)
        target = TargetHead.of(features, ids)  # the target's head over the draft vocabulary
        trained = supervised
        if cfg.drop_out_of_vocab:
            trained = supervised & in_vocab_elements(features.greedy, ids, k, len(module.t2d))
        labels = None
        if cfg.loss == "hard_ce":
            labels = element_labels(batch.input_ids, ids, k, len(module.t2d))
            trained = trained & (labels >= 0)
        total = int((grid & trained).sum())

        def part(forward: Tensor, own: Tensor) -> Callable[[], StepResult]:
            def run() -> StepResult:
                e = Elements.from_grid(forward)
                hidden = draft(aux, batch.input_ids, e, head=False)
                sup = e.pick(own & supervised)
                out, kl = peagle_loss(
                    hidden,
                    module.lm_head.weight,
                    target,
                    e,
                    e.pick(own & trained),
                    total,
                    cfg.loss,
                    None if labels is None else labels[e.rows(), e.anchor, e.depth],
                )
                n = int(sup.sum())
                correct = (out.draft_argmax == out.target_argmax).view_as(sup)
                metrics = {
                    "loss": (kl * sup).sum().item() / max(n, 1),
                    **depth_metrics(correct, sup, e, grid.shape[1], k),
                }
                return StepResult(loss=out.loss, metrics=metrics, weight=n)

            return run

        segments = num_segments or cfg.num_segments
        return [part(fwd, own) for fwd, own in segment_grids(grid, segments)]

    def compute_loss(
        self, draft: nn.Module, features: TargetFeatures, batch: Batch, cfg: PEagleConfig
    ) -> StepResult:
        (whole,) = self.loss_parts(draft, features, batch, cfg, num_segments=1)
        return whole()

    def activations(
        self, cfg: PEagleConfig, target: TargetDescription, tokens: int, rows: int
    ) -> DraftActivations:
        """The sampled elements (every token at depth 0, a kept share at each later depth)
        through every layer, one segment of them per backward."""
        keep = sum(keep_fractions(cfg.parallel_steps, cfg.keep_ratio, cfg.min_keep_ratio))
        return DraftActivations(
            units=math.ceil(tokens * keep / cfg.num_segments),
            layer=layer_shape(DecoderDims.from_target(target), draft_qk_norm(cfg.qk_norm, target)),
            num_layers=cfg.num_layers,
            first_input=2 * target.hidden_size,
            first_norms=2,
            per_token=len(self.target_layer_ids(cfg, target)) * target.hidden_size,
            what=f"draft.parallel_steps={cfg.parallel_steps}",
        )

    @torch.no_grad()
    def propose(
        self,
        draft: nn.Module,
        features: TargetFeatures,
        input_ids: Tensor,
        cfg: PEagleConfig,
        num_steps: int,
    ) -> Tensor:
        """All depths of every anchor in one forward: entry [t, d] guesses x_{t+2+d}."""
        b, t = input_ids.shape
        lengths = torch.full((b,), t, device=input_ids.device)
        grid = sample_elements(lengths, t, num_steps, None, None)
        e = Elements.from_grid(grid)
        logits = draft(features.aux.to(draft.fc.weight.dtype), input_ids, e)
        out = torch.full((b, t, num_steps), -1, dtype=torch.long, device=input_ids.device)
        rows = torch.arange(b, device=input_ids.device)[:, None]
        guess = draft_ids(draft)[logits.argmax(-1)]
        out[rows, e.anchor, e.depth] = torch.where(e.valid, guess, out[rows, e.anchor, e.depth])
        return out

    def to_vllm(
        self, state: dict[str, Tensor], cfg: PEagleConfig, target: TargetDescription
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


def in_vocab_elements(argmax: Tensor, ids: Tensor, depths: int, vocab_size: int) -> Tensor:
    """(B,T,K) bool: the target's argmax (``argmax`` (B,T), over its ``vocab_size`` tokens)
    for element (a, d), at position a+1+d, is one of the draft vocabulary's target ids
    ``ids``."""
    member = torch.zeros(vocab_size, dtype=torch.bool, device=argmax.device)
    member[ids] = True
    t = argmax.shape[1]
    pos = (
        torch.arange(t, device=argmax.device)[:, None]
        + 1
        + torch.arange(depths, device=argmax.device)
    ).clamp(max=t - 1)
    return member[argmax[:, pos]]


def element_labels(input_ids: Tensor, ids: Tensor, depths: int, vocab_size: int) -> Tensor:
    """(B,T,K) long: the draft-vocabulary index of the token element (a, d) drafts,
    x_{a+2+d} (clamped inside the sequence), -1 where that token is outside the draft
    vocabulary ``ids`` (target ids in draft order) of a ``vocab_size``-token target."""
    to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device=input_ids.device)
    to_draft[ids] = torch.arange(len(ids), device=input_ids.device)
    t = input_ids.shape[1]
    pos = (
        torch.arange(t, device=input_ids.device)[:, None]
        + 2
        + torch.arange(depths, device=input_ids.device)
    ).clamp(max=t - 1)
    return to_draft[input_ids[:, pos]]


def resolve_mask_token_id(cfg: PEagleConfig, target: FrozenTarget) -> int:
    """``draft.mask_token_id``, or the target tokenizer's mask token; inside the vocab."""
    vocab_size = target.description.vocab_size
    mask_id = cfg.mask_token_id
    if mask_id is None:
        path = target.model.name_or_path
        try:
            mask_id = AutoTokenizer.from_pretrained(path).mask_token_id
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"draft.mask_token_id is not set and the target's tokenizer at "
                f"{path!r} could not be read ({exc}); set draft.mask_token_id"
            ) from None
        if mask_id is None:
            raise ValueError(
                f"draft.mask_token_id is not set and the target's tokenizer at "
                f"{path!r} has no mask token; set draft.mask_token_id to a "
                f"reserved token id in 0..{vocab_size - 1}"
            )
    if not 0 <= mask_id < vocab_size:
        raise ValueError(
            f"draft.mask_token_id {mask_id} is outside the target vocabulary "
            f"(expected 0..{vocab_size - 1})"
        )
    return mask_id
