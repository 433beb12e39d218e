"""What the EAGLE family of drafts (EAGLE-1, EAGLE-3, P-EAGLE) shares, beside their folders:
the draft shape, the q/k/v attention with optional q/k norm, EAGLE-3's fused first layer and
the plain pre-norm decoder layer, slot alignment helpers, the aux-layer rule, and the vLLM
config and tensor table of the fused-layer drafter (EAGLE-3 and P-EAGLE)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from eagle_train.config import ConfigError
from eagle_train.drafts import kernels
from eagle_train.drafts.base import SpeculatorsFields
from eagle_train.drafts.common import (
    MLP,
    DecoderDims,
    RMSNorm,
    decoder_fields,
    layer_tensors,
    mirror_target,
)
from eagle_train.drafts.ttt_attention import ttt_attention
from eagle_train.target_model import TargetDescription

# A key/value list per layer: entry j holds the (k, v) of chain step j (see ttt_attention).
LayerKV = list[tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class DraftShape(DecoderDims):
    """Sizes of an EAGLE-family draft: the target's (``DecoderDims.from_target``) plus these."""

    num_aux: int
    draft_vocab_size: int
    qk_norm: bool


def draft_qk_norm(configured: bool | None, target: TargetDescription) -> bool:
    """Whether the draft's attention normalises q and k (``draft.qk_norm``): as configured,
    else as the target's attention does."""
    return target.qk_norm if configured is None else configured


def aux_layer_ids(configured: list[int] | None, target: TargetDescription) -> list[int]:
    """The target layers fused by fc ("after k layers"): as configured, else vLLM's default."""
    num_layers = target.num_layers
    ids = list(configured or target.default_aux_layer_ids)
    if len(set(ids)) != len(ids) or any(not 0 <= k <= num_layers for k in ids):
        raise ConfigError(
            f"draft.aux_layer_ids {ids} must be distinct layer counts in 0..{num_layers} "
            f"(the target has {num_layers} layers); set draft.aux_layer_ids explicitly"
        )
    return sorted(ids)


def set_backend(model: nn.Module, backend: str) -> None:
    """Use ``backend`` in every attention module of ``model`` (a plain attribute: not saved)."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.backend = backend


class Attention(nn.Module):
    """q/k/v over the 2H input ``cat(norm(embed), hidden_norm(h))``; optional q/k norm.

    ``in_size`` overrides the input width (H for an ordinary decoder layer)."""

    def __init__(self, s: DraftShape, in_size: int | None = None) -> None:
        super().__init__()
        self.s = s
        width = in_size or 2 * s.hidden_size
        self.q_proj = nn.Linear(width, s.num_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(width, s.num_kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(width, s.num_kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=False)
        if s.qk_norm:
            self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
            self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.backend = "auto"  # TTT attention kernel (draft.attention), set by set_backend

    def project(
        self, x: Tensor, rope: tuple[Tensor, Tensor], rows: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(B,T,in) -> q (B,h,T,D) and k, v repeated to h heads (GQA), rotary applied.
        ``rows`` (B,T) bool: project those slots only, zeros elsewhere (``at_rows``)."""
        b, t, _ = x.shape
        s = self.s
        q = at_rows(self.q_proj, x, rows).view(b, t, s.num_heads, s.head_dim)
        k = at_rows(self.k_proj, x, rows).view(b, t, s.num_kv_heads, s.head_dim)
        v = at_rows(self.v_proj, x, rows).view(b, t, s.num_kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        q, k = apply_rotary_pos_emb(q, k, *rope)
        groups = s.num_heads // s.num_kv_heads
        return q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)


def at_rows(fn: Callable[[Tensor], Tensor], x: Tensor, rows: Tensor | None) -> Tensor:
    """``fn`` (a per-slot map, e.g. a linear layer or an MLP) of ``x`` (B,T,in) at the slots
    ``rows`` (B,T) bool only, zeros at the others; all slots when ``rows`` is None. A
    training-time-test step computes only the slots whose output some loss term reads."""
    if rows is None:
        return fn(x)
    picked = fn(x[rows])
    out = picked.new_zeros(*rows.shape, picked.shape[-1])
    out[rows] = picked
    return out


def after_attention(layer: nn.Module, h: Tensor, attn: Tensor, rows: Tensor | None) -> Tensor:
    """A decoder layer's residual stream ``h`` (B,T,H) after its attention ``attn``
    (B,T,h*D): o_proj, then the post-attention norm and MLP, at ``rows`` only (None: every
    slot; elsewhere the result is ``h`` unchanged)."""
    h = h + at_rows(layer.self_attn.o_proj, attn, rows)
    return h + at_rows(lambda y: layer.mlp(layer.post_attention_layernorm(y)), h, rows)


class FusedLayer(nn.Module):
    """EAGLE-3's decoder layer; residual is the incoming hidden (norm_before_residual=false)."""

    def __init__(self, s: DraftShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.hidden_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)


class DecoderLayer(nn.Module):
    """Pre-norm Llama layer over H; ``input_norm=False`` drops input_layernorm (identity)."""

    def __init__(self, s: DraftShape, input_norm: bool = True) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps) if input_norm else None
        self.self_attn = Attention(s, in_size=s.hidden_size)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)

    def forward(
        self,
        h: Tensor,
        rope: tuple[Tensor, Tensor],
        mask: object = None,
        kv: LayerKV | None = None,
        rows: Tensor | None = None,
        out_rows: Tensor | None = None,
    ) -> Tensor:
        """``h`` (B,N,H). Attention: ``mask`` (B,1,N,N) bool (True = may attend); None and
        no ``kv`` = causal; with ``kv`` = a training-time-test chain step (keys appended).
        ``rows`` / ``out_rows`` (B,N) bool: compute q/k/v / the output only at those slots
        (zeros elsewhere; None: all)."""
        x = h if self.input_layernorm is None else self.input_layernorm(h)
        q, k, v = self.self_attn.project(x, rope, rows)
        if kv:  # chain step >= 1: causal step-0 keys + this slot's own chain
            kd = torch.stack([kj for kj, _ in kv[1:]] + [k], dim=3)
            vd = torch.stack([vj for _, vj in kv[1:]] + [v], dim=3)
            attn = ttt_attention(q, kv[0][0], kv[0][1], kd, vd, self.self_attn.backend)
        else:
            attn = kernels.masked_attention(q, k, v, mask)
        if kv is not None:
            kv.append((k, v))
        b, _, n, _ = attn.shape
        return after_attention(self, h, attn.transpose(1, 2).reshape(b, n, -1), out_rows)


class FusedInput(nn.Module):
    """The base of the drafts that fuse the target's aux features with fc (EAGLE-3, P-EAGLE):
    ``fc`` with EAGLE-3.1's optional norms before it, under vLLM's names (``input_norm``,
    ``fc_norm.i``, ``fc``); ``fuse`` is vLLM's ``combine_hidden_states``."""

    input_norm: RMSNorm | None
    fc_norm: nn.ModuleList | None
    fc: nn.Linear

    def build_fusion(self, s: DraftShape, norm_before_fc: bool, fc_norm: bool) -> None:
        fc_in = s.num_aux * s.target_hidden_size
        self.input_norm = RMSNorm(fc_in, s.rms_norm_eps) if norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(RMSNorm(s.target_hidden_size, s.rms_norm_eps) for _ in range(s.num_aux))
            if fc_norm
            else None
        )
        self.fc = nn.Linear(fc_in, s.hidden_size, bias=False)

    def fuse(self, aux: Tensor) -> Tensor:
        """(..., n*TH) aux features -> (..., H)."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        if self.fc_norm is not None:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], -1)
        return self.fc(aux)


def shift_left(x: Tensor, n: int) -> Tensor:
    """Shift dim 1 left by ``n``, repeating the last entry (those slots are masked anyway)."""
    if n == 0:
        return x
    last = x[:, -1:]
    pad = last.expand(last.shape[0], min(n, x.shape[1]), *last.shape[2:])
    return torch.cat([x[:, n:], pad], dim=1)[:, : x.shape[1]]


def valid_slots(loss_mask: Tensor, lengths: Tensor, step: int) -> Tensor:
    """(B,T) bool: slot t of step ``step`` predicts a real assistant token (x_{t+2+step})."""
    b, t = loss_mask.shape
    target_pos = torch.arange(t, device=loss_mask.device) + 2 + step
    inside = target_pos[None, :] < lengths[:, None]
    return inside & shift_left(loss_mask, 2 + step).bool()


def draft_ids(draft: nn.Module) -> Tensor:
    """Target token id of every draft-vocabulary entry (``id + d2t[id]``)."""
    return torch.arange(len(draft.d2t), device=draft.d2t.device) + draft.d2t


def fused_vllm_config(
    qk_norm: bool,
    target: TargetDescription,
    layer_ids: list[int],
    draft_vocab_size: int,
    head_dim: int,
    num_kv_heads: int | None = None,
) -> dict[str, Any]:
    """vLLM's config.json of a fused-first-layer drafter (one layer; EAGLE-3 and P-EAGLE set
    their own num_hidden_layers): vLLM builds q/k norm into a Qwen3-style layer and none into
    a Llama one."""
    style = "qwen3" if qk_norm else "llama"
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM" if style == "qwen3" else "LlamaForCausalLM"],
        "model_type": style,
        **decoder_fields(target, head_dim, 1, num_kv_heads),
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": target.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "num_aux_hidden_states": len(layer_ids),
        "norm_before_residual": False,
        "dtype": "bfloat16",
    }
    return mirror_target(config, target)


def fused_tensors(
    config: dict[str, Any],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor shapes of a fused-first-layer drafter ``config``."""
    h, th = config["hidden_size"], config["target_hidden_size"]
    v, vd = config["vocab_size"], config["draft_vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, config["num_aux_hidden_states"] * th),
        "layers.0.hidden_norm.weight": (h,),
        # the fused layer: q/k/v over cat(embedding, hidden), 2H wide
        **layer_tensors(config, 0, in_width=2 * h, qk_norm=config["model_type"] == "qwen3"),
        "norm.weight": (h,),
        "lm_head.weight": (vd, h),
    }
    for i in range(1, config.get("num_hidden_layers", 1)):  # ordinary layers: q/k/v over H
        shapes.update(layer_tensors(config, i, qk_norm=config["model_type"] == "qwen3"))
    shapes.update(eagle31_tensors(config))
    if vd != v:  # without d2t vLLM maps draft ids 0..Vd-1 and acceptance collapses
        shapes["d2t"] = (vd,)
    # Absent: vLLM shares the target's embedding; present and different: the draft's own.
    return shapes, {"embed_tokens.weight": (v, h)}


# Native fused-drafter keys that are top-level fields of the speculators format.
_FUSED_TOP_LEVEL = (
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "norm_before_residual",
)


def fused_speculators(
    model_type: str,
    architecture: str,
    config: dict[str, Any],
    state: dict[str, Tensor],
    **fields: Any,
) -> SpeculatorsFields:
    """The speculators-format view of a fused-layer drafter ``config``: its EAGLE fields at
    the top (vLLM reads ``norm_before_residual`` as true when absent, so it is always
    written), and ``t2d`` beside ``d2t`` as speculators checkpoints carry it."""
    top = {key: config[key] for key in _FUSED_TOP_LEVEL}
    extra = {"t2d": state["t2d"]} if "d2t" in fused_tensors(config)[0] and "t2d" in state else {}
    return SpeculatorsFields(
        speculators_type=model_type,
        architecture=architecture,
        fields={**top, **fields},
        moved=(*_FUSED_TOP_LEVEL, "parallel_drafting", *fields),
        extra_tensors=extra,
    )


def fused_from_speculators(
    config: dict[str, Any], speculators_type: str, norm_before_residual: bool
) -> dict[str, Any] | None:
    """vLLM's native config of a speculators-format fused-layer drafter of
    ``speculators_type`` (None for another type), rebuilt as vLLM's own speculators loader
    does (``transformers_utils/configs/speculators/algos.py``): the layer config with the
    EAGLE fields on top; ``norm_before_residual`` defaults to vLLM's per-type default."""
    if config.get("speculators_model_type") != speculators_type:
        return None
    native = dict(config.get("transformer_layer_config") or {})
    native.update(
        draft_vocab_size=config.get("draft_vocab_size"),
        norm_before_residual=config.get("norm_before_residual", norm_before_residual),
    )
    for key in ("target_hidden_size", "eagle_aux_hidden_state_layer_ids", *EAGLE31_SWITCHES):
        if config.get(key) is not None:
            native[key] = config[key]
    native["architectures"] = [f"Eagle3{native.get('model_type', 'llama').title()}ForCausalLM"]
    return native


# The EAGLE-3.1 switches of vLLM's EAGLE-3 drafter config (``llama_eagle3.py``), all false
# when absent: ``norm_before_fc`` one RMSNorm over the concatenated aux features
# (``input_norm``), ``fc_norm`` one RMSNorm per aux chunk (``fc_norm.i``) (these two are
# FUSION_SWITCHES, P-EAGLE's too), ``norm_output`` the next step's hidden taken after the
# final norm instead of before it.
FUSION_SWITCHES = ("norm_before_fc", "fc_norm")
EAGLE31_SWITCHES = (*FUSION_SWITCHES, "norm_output")


def switches(cfg: Any, keys: tuple[str, ...]) -> dict[str, bool]:
    """The config.json values of the switches ``keys`` of a draft config."""
    return {key: bool(getattr(cfg, key)) for key in keys}


def eagle31_tensors(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The norms vLLM builds for the EAGLE-3.1 switches set in ``config``."""
    n, th = config["num_aux_hidden_states"], config["target_hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {}
    if config.get("norm_before_fc"):
        shapes["input_norm.weight"] = (n * th,)
    if config.get("fc_norm"):
        shapes.update({f"fc_norm.{i}.weight": (th,) for i in range(n)})
    return shapes


# SafeAILab's EAGLE-3 checkpoints name the fused layer ``midlayer``; vLLM renames it.
_SAFEAILAB_RENAMES = {"midlayer.": "layers.0."}


def fused_import(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """A fused-layer drafter's tensors under the draft's names: the inverse of the export map
    (the identity: exported names are the draft's) after vLLM's own renames."""
    out = {}
    for name, tensor in tensors.items():
        for old, new in _SAFEAILAB_RENAMES.items():
            name = name.replace(old, new)
        out[name] = tensor
    return out
