"""P-EAGLE -> vLLM ``method="eagle3"`` with ``parallel_drafting: true`` (docs/algorithms/peagle.md):
the fused-layer drafter's config and tensors plus ``mask_token_id``, ``mask_hidden`` and ``embed_tokens``
(carrying the trained mask row), and the ordinary layers after the fused one."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from eagle_train.drafts.base import VllmDrafter
from eagle_train.drafts.eagle_family import (
    FUSION_SWITCHES,
    draft_qk_norm,
    fused_from_speculators,
    fused_import,
    fused_speculators,
    fused_tensors,
    fused_vllm_config,
    switches,
)
from eagle_train.drafts.peagle.config import PEagleConfig
from eagle_train.target_model import TargetDescription


def vllm_config(
    cfg: PEagleConfig,
    target: TargetDescription,
    layer_ids: list[int],
    draft_vocab_size: int,
    head_dim: int,
    mask_token_id: int,
) -> dict[str, Any]:
    qk_norm = draft_qk_norm(cfg.qk_norm, target)
    config = fused_vllm_config(qk_norm, target, layer_ids, draft_vocab_size, head_dim)
    # vLLM ignores parallel_drafting in config.json (the speculative config turns it on);
    # it marks the format so that it is not taken for a plain EAGLE-3 drafter.
    config.update(
        num_hidden_layers=cfg.num_layers,
        mask_token_id=mask_token_id,
        parallel_drafting=True,
        **switches(cfg, FUSION_SWITCHES),  # vLLM's EAGLE-3 loader builds their norms
    )
    return config


def expected_tensors(
    config: dict[str, Any],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    required, _ = fused_tensors(config)  # the ordinary layers after the fused one included
    h = config["hidden_size"]
    required["mask_hidden"] = (config["num_aux_hidden_states"] * config["target_hidden_size"],)
    required["embed_tokens.weight"] = (config["vocab_size"], h)  # the trained mask row
    return required, {}


def to_vllm(
    state: dict[str, Tensor], cfg: PEagleConfig, target: TargetDescription, layer_ids: list[int]
) -> VllmDrafter:
    vd = state["lm_head.weight"].shape[0]
    head_dim = state["layers.0.self_attn.q_proj.weight"].shape[0] // target.num_heads
    mask_id = int(state["mask_token_id"])
    config = vllm_config(cfg, target, layer_ids, vd, head_dim, mask_id)
    names = set(expected_tensors(config)[0]) - {"embed_tokens.weight"}
    tensors = {name: state[name] for name in names if name in state}
    if "embed_tokens.weight" in state and "mask_embedding" in state:
        embed = state["embed_tokens.weight"].clone()
        embed[mask_id] = state["mask_embedding"].to(embed.dtype)
        tensors["embed_tokens.weight"] = embed
    return VllmDrafter(
        config=config,
        tensors=tensors,
        method="eagle3",
        num_speculative_tokens=cfg.parallel_steps,
        extra_speculative_config={"parallel_drafting": True},
        # vLLM turns parallel drafting on for the "peagle" speculators type by itself.
        # vLLM's "peagle" speculators loader reads norm_before_fc at the top level only (and
        # overwrites the layer config's); fc_norm it reads from the layer config.
        speculators=fused_speculators(
            "peagle",
            "PEagleSpeculator",
            config,
            state,
            mask_token_id=mask_id,
            norm_before_fc=cfg.norm_before_fc,
        ),
    )


def from_speculators(config: dict[str, Any]) -> dict[str, Any] | None:
    """The native config of a speculators-format P-EAGLE drafter (vLLM's mask token
    ``pard_token`` is ``mask_token_id`` here); None for another type."""
    native = fused_from_speculators(config, "peagle", norm_before_residual=False)
    if native is not None:
        native.update(mask_token_id=config.get("mask_token_id"), parallel_drafting=True)
    return native


def import_tensors(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """The inverse of ``to_vllm``'s map: the mask token's row of the shipped embedding is the
    trained ``mask_embedding``; the rest is by name."""
    out = fused_import(tensors)
    if "embed_tokens.weight" in out and config.get("mask_token_id") is not None:
        out["mask_embedding"] = out["embed_tokens.weight"][int(config["mask_token_id"])]
    return out
