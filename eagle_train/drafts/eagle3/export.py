"""EAGLE-3 -> vLLM ``method="eagle3"`` (docs/algorithms/eagle3.md): config.json and tensor names
(the fused-layer drafter the EAGLE family shares: N layers, EAGLE-3.1's switches)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from eagle_train.drafts.base import VllmDrafter
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.eagle_family import (
    EAGLE31_SWITCHES,
    draft_qk_norm,
    fused_from_speculators,
    fused_import,
    fused_speculators,
    fused_tensors,
    fused_vllm_config,
    switches,
)
from eagle_train.target_model import TargetDescription


def vllm_config(
    cfg: Eagle3Config,
    target: TargetDescription,
    layer_ids: list[int],
    draft_vocab_size: int,
    head_dim: int,
    num_kv_heads: int,
) -> dict[str, Any]:
    qk_norm = draft_qk_norm(cfg.qk_norm, target)
    config = fused_vllm_config(qk_norm, target, layer_ids, draft_vocab_size, head_dim, num_kv_heads)
    # vLLM's loader reads num_hidden_layers and the EAGLE-3.1 switches (absent: false).
    config.update(num_hidden_layers=cfg.num_layers, **eagle31_switches(cfg))
    return config


def eagle31_switches(cfg: Eagle3Config) -> dict[str, bool]:
    return switches(cfg, EAGLE31_SWITCHES)


def expected_tensors(
    config: dict[str, Any],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor shapes for ``config``."""
    return fused_tensors(config)


def to_vllm(
    state: dict[str, Tensor], cfg: Eagle3Config, target: TargetDescription, layer_ids: list[int]
) -> VllmDrafter:
    vd = state["lm_head.weight"].shape[0]
    head_dim = state["layers.0.self_attn.q_proj.weight"].shape[0] // target.num_heads
    kv_heads = state["layers.0.self_attn.k_proj.weight"].shape[0] // head_dim
    config = vllm_config(cfg, target, layer_ids, vd, head_dim, kv_heads)
    names = set(expected_tensors(config)[0])
    if cfg.train_embedding:  # a trained embedding differs from the target's: ship it
        names.add("embed_tokens.weight")
    tensors = {name: state[name] for name in names if name in state}
    return VllmDrafter(
        config=config,
        tensors=tensors,
        method="eagle3",
        num_speculative_tokens=cfg.ttt_steps,
        # vLLM's speculators loader reads the switches at the top level only.
        speculators=fused_speculators(
            "eagle3", "Eagle3Speculator", config, state, **eagle31_switches(cfg)
        ),
    )


def from_speculators(config: dict[str, Any]) -> dict[str, Any] | None:
    """The native config of a speculators-format EAGLE-3 drafter (vLLM reads a missing
    ``norm_before_residual`` as true for this type); None for another type."""
    return fused_from_speculators(config, "eagle3", norm_before_residual=True)


def import_tensors(tensors: dict[str, Tensor], config: dict[str, Any]) -> dict[str, Tensor]:
    """A drafter's tensors (any layout vLLM serves) under this draft's parameter names."""
    return fused_import(tensors)
