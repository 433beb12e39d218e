"""Pieces every draft shares: the sizes a draft mirrors from its target (one builder from the
target description), the target's RoPE, the RMSNorm and SwiGLU MLP vLLM's drafters use, and
the config.json fields and per-layer tensor table of an exported drafter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from eagle_train.memory_plan import LayerShape
from eagle_train.target_model import TargetDescription

_Dims = TypeVar("_Dims", bound="DecoderDims")


@dataclass(frozen=True)
class DecoderDims:
    """The target sizes every draft's decoder mirrors (attention geometry included); each
    draft's shape extends it with its own fields and is built by ``from_target``."""

    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    rms_norm_eps: float

    @classmethod
    def from_target(cls: type[_Dims], target: TargetDescription, **extra: Any) -> _Dims:
        """The target's sizes, then ``extra``: the draft's own fields, and any mirrored one
        the draft sets for itself (e.g. ``num_kv_heads``)."""
        mirrored = {
            "hidden_size": target.hidden_size,
            "target_hidden_size": target.hidden_size,
            "num_heads": target.num_heads,
            "num_kv_heads": target.num_kv_heads,
            "head_dim": target.head_dim,
            "intermediate_size": target.intermediate_size,
            "vocab_size": target.vocab_size,
            "rms_norm_eps": target.rms_norm_eps,
        }
        return cls(**{**mirrored, **extra})


def layer_shape(dims: DecoderDims, qk_norm: bool) -> LayerShape:
    """The shape of one of the draft's decoder layers, for the memory pre-flight."""
    return LayerShape(
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_heads=dims.num_heads,
        num_kv_heads=dims.num_kv_heads,
        head_dim=dims.head_dim,
        qk_norm=qk_norm,
    )


def rotary_embedding(target: TargetDescription) -> LlamaRotaryEmbedding:
    """The target's rotary embedding (type, base and scaling as the target config sets them),
    computed as vLLM's Llama-style drafters compute it."""
    config = LlamaConfig(
        hidden_size=target.hidden_size,
        num_attention_heads=target.num_heads,
        head_dim=target.head_dim,
        max_position_embeddings=target.max_position_embeddings,
        rope_parameters=dict(target.rope.parameters),
    )
    return LlamaRotaryEmbedding(config)


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


def decoder_fields(
    target: TargetDescription, head_dim: int, num_layers: int, num_kv_heads: int | None = None
) -> dict[str, Any]:
    """config.json fields of draft decoder layers that mirror the target's attention and MLP
    (``num_kv_heads``: the draft's own key/value heads where they differ from the target's)."""
    return {
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": num_kv_heads or target.num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": target.vocab_size,
    }


def mirror_target(config: dict[str, Any], target: TargetDescription) -> dict[str, Any]:
    """``config`` with the target's RoPE, position limit and special ids added."""
    config.update(target.mirrored_fields())
    return config


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
