"""Pieces every draft shares: the RMSNorm vLLM's drafters use, and the target config fields
an exported drafter mirrors."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig

# Target config fields the draft mirrors (RoPE, positions, special ids), copied when present.
# max_position_embeddings must cover the serving length (vLLM does not raise it for every
# drafter, and drafting silently stops beyond it): the target's limit covers what it serves.
MIRRORED = (
    "rope_parameters",
    "rope_theta",
    "max_position_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class MLP(nn.Module):
    """The SwiGLU MLP of Llama/Qwen3 layers (gate and up stay separate: vLLM fuses them)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def attention_dims(target: PretrainedConfig) -> tuple[int, int, int]:
    """(heads, kv heads, head dim) of the target's attention, which every draft mirrors."""
    heads = target.num_attention_heads
    kv_heads = getattr(target, "num_key_value_heads", None) or heads
    return heads, kv_heads, getattr(target, "head_dim", None) or target.hidden_size // heads


def decoder_fields(target: PretrainedConfig, head_dim: int, num_layers: int) -> dict[str, Any]:
    """config.json fields of draft decoder layers that mirror the target's attention and MLP."""
    heads, kv_heads, _ = attention_dims(target)
    return {
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": target.vocab_size,
    }


def layer_tensors(
    config: dict[str, Any],
    index: int,
    *,
    in_width: int | None = None,
    input_norm: bool = True,
    qk_norm: bool = False,
) -> dict[str, tuple[int, ...]]:
    """Shapes of decoder layer ``index``'s tensors as vLLM names them (q/k/v and gate/up
    separate), for a drafter ``config``; ``in_width`` is q/k/v's input width (default H)."""
    h, d, inter = config["hidden_size"], config["head_dim"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    width = in_width or h
    p = f"layers.{index}."
    shapes: dict[str, tuple[int, ...]] = {p + "input_layernorm.weight": (h,)} if input_norm else {}
    shapes.update(
        {
            p + "self_attn.q_proj.weight": (heads * d, width),
            p + "self_attn.k_proj.weight": (kv * d, width),
            p + "self_attn.v_proj.weight": (kv * d, width),
            p + "self_attn.o_proj.weight": (h, heads * d),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    )
    if qk_norm:
        shapes[p + "self_attn.q_norm.weight"] = (d,)
        shapes[p + "self_attn.k_norm.weight"] = (d,)
    return shapes


def mirror_target(config: dict[str, Any], target: PretrainedConfig) -> dict[str, Any]:
    """``config`` with the target's ``MIRRORED`` fields added (those it sets)."""
    for key in MIRRORED:
        value = getattr(target, key, None)
        if value is not None:
            config[key] = value
    return config
