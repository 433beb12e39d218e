"""The EAGLE-3 draft: fc over fused target features, one fused decoder layer, own lm_head.

Parameter names are vLLM's EAGLE-3 names (``fc``, ``layers.0.*``, ``norm``, ``lm_head``), so
export is a filter and a dtype cast, not a rename. The module is single-device; DDP/FSDP wrap
it from outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from eagle_train.drafts.common import MLP, RMSNorm, attention_dims
from eagle_train.drafts.eagle3.attention import ttt_attention


@dataclass(frozen=True)
class DraftShape:
    """Sizes of the draft, read off the target config (the draft mirrors its attention)."""

    hidden_size: int
    target_hidden_size: int
    num_aux: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float
    qk_norm: bool

    @classmethod
    def from_target(
        cls, target: PretrainedConfig, num_aux: int, draft_vocab_size: int, qk_norm: bool
    ) -> DraftShape:
        heads, kv_heads, head_dim = attention_dims(target)
        return cls(
            hidden_size=target.hidden_size,
            target_hidden_size=target.hidden_size,
            num_aux=num_aux,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=target.intermediate_size,
            vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size,
            rms_norm_eps=target.rms_norm_eps,
            qk_norm=qk_norm,
        )


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
        self.backend = "auto"  # TTT attention kernel; set from the config by set_backend

    def project(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(B,T,in) -> q (B,h,T,D) and k, v repeated to h heads (GQA), rotary applied."""
        b, t, _ = x.shape
        s = self.s
        q = self.q_proj(x).view(b, t, s.num_heads, s.head_dim)
        k = self.k_proj(x).view(b, t, s.num_kv_heads, s.head_dim)
        v = self.v_proj(x).view(b, t, s.num_kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        q, k = apply_rotary_pos_emb(q, k, *rope)
        groups = s.num_heads // s.num_kv_heads
        return q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)


class FusedLayer(nn.Module):
    """EAGLE-3's decoder layer; residual is the incoming hidden (norm_before_residual=false)."""

    def __init__(self, s: DraftShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.hidden_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)


@dataclass
class DraftOutput:
    logits: list[Tensor]  # per TTT step: (B, T, Vd) at slot t, predicting x_{t+2+step}


class Eagle3Draft(nn.Module):
    def __init__(self, s: DraftShape, target: PretrainedConfig) -> None:
        super().__init__()
        self.shape = s
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.fc = nn.Linear(s.num_aux * s.target_hidden_size, s.hidden_size, bias=False)
        self.layers = nn.ModuleList([FusedLayer(s)])
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.lm_head = nn.Linear(s.hidden_size, s.draft_vocab_size, bias=False)
        # target_id = draft_id + d2t[draft_id]; t2d marks target ids inside the draft vocab.
        self.register_buffer("d2t", torch.zeros(s.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(s.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(target)  # the target's RoPE, scaling included

    def step(
        self, hidden: Tensor, tokens: Tensor, positions: Tensor, kv: list[tuple[Tensor, Tensor]]
    ) -> Tensor:
        """One TTT step. ``hidden`` (B,T,H) is fc(aux) at step 0, else the previous step's
        pre-norm output; ``tokens`` (B,T) the next ground-truth token of each slot. The step's
        keys are appended to ``kv``. Returns this step's pre-norm output (B,T,H)."""
        layer = self.layers[0]
        x = torch.cat(
            [layer.input_layernorm(self.embed_tokens(tokens)), layer.hidden_norm(hidden)], dim=-1
        )
        q, k, v = layer.self_attn.project(x, self.rotary(x, positions))
        if not kv:  # step 0: plain causal attention over the real context
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # later steps: causal step-0 keys + this slot's chain (the diagonal)
            kd = torch.stack([kj for kj, _ in kv[1:]] + [k], dim=3)
            vd = torch.stack([vj for _, vj in kv[1:]] + [v], dim=3)
            attn = ttt_attention(q, kv[0][0], kv[0][1], kd, vd, layer.self_attn.backend)
        kv.append((k, v))
        b, _, t, _ = attn.shape
        h = hidden + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def forward(self, aux: Tensor, input_ids: Tensor, num_steps: int) -> DraftOutput:
        """``aux`` (B,T,n*TH) target features at slot t; ``input_ids`` (B,T) the sequence x.

        Step k at slot t takes token x_{t+1+k} at RoPE position t+k. Tokens past the end
        are padded with the last id; their slots are masked out by the loss.
        """
        b, t = input_ids.shape
        hidden = self.fc(aux)
        base = torch.arange(t, device=input_ids.device).expand(b, t)
        kv: list[tuple[Tensor, Tensor]] = []
        logits = []
        for k in range(num_steps):
            tokens = shift_left(input_ids, 1 + k)
            hidden = self.step(hidden, tokens, base + k, kv)
            logits.append(self.lm_head(self.norm(hidden)))
        return DraftOutput(logits=logits)


def set_backend(model: nn.Module, backend: str) -> None:
    """Use ``backend`` in every attention module of ``model`` (a plain attribute: not saved)."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.backend = backend


def shift_left(x: Tensor, n: int) -> Tensor:
    """Shift dim 1 left by ``n``, repeating the last entry (those slots are masked anyway)."""
    if n == 0:
        return x
    last = x[:, -1:]
    pad = last.expand(last.shape[0], min(n, x.shape[1]), *last.shape[2:])
    return torch.cat([x[:, n:], pad], dim=1)[:, : x.shape[1]]
