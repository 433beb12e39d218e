"""The DFlash draft: fused target context injected as keys/values into Qwen3-style layers
that denoise a block ``[anchor, MASK, ...]`` in one pass.

Parameter names are vLLM's DFlash names (``fc``, ``hidden_norm``, ``layers.i.*``, ``norm``),
so export is a filter and a dtype cast. The embedding and lm_head are the target's, frozen
and shared: the draft holds references to them outside its parameters and state dict, so
neither is trained, checkpointed, wrapped by DDP or exported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from eagle_train.drafts.common import MLP, DecoderDims, RMSNorm, rotary_embedding
from eagle_train.drafts.dflash.attention import block_attention
from eagle_train.drafts.dflash.blocks import block_positions
from eagle_train.target_model import TargetDescription


@dataclass(frozen=True)
class DFlashShape(DecoderDims):
    """Sizes of the draft: the target's (``DecoderDims.from_target``) plus these."""

    num_features: int  # target layers concatenated into fc's input
    num_layers: int
    block_size: int
    mask_token_id: int


class Attention(nn.Module):
    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.num_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.backend = "auto"  # block attention kernel, set from draft.attention at build

    def keys_values(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """(Bt,L,H) -> k, v (Bt,h,L,D): k_norm then RoPE on keys, repeated to h heads (GQA)."""
        b, length, _ = x.shape
        s = self.s
        k = self.k_norm(self.k_proj(x).view(b, length, s.num_kv_heads, s.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, length, s.num_kv_heads, s.head_dim).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, *rope)
        groups = s.num_heads // s.num_kv_heads
        return k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)

    def queries(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        b, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, length, self.s.num_heads, self.s.head_dim))
        q = q.transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, *rope)
        return q


class DecoderLayer(nn.Module):
    def __init__(self, s: DFlashShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)

    def forward(
        self,
        h: Tensor,
        ctx: Tensor,
        anchors: Tensor,
        rope_ctx: tuple[Tensor, Tensor],
        rope_blk: tuple[Tensor, Tensor],
    ) -> Tensor:
        """``h`` (Bt, N*B, H) block stream; ``ctx`` (Bt, T, H) the fused target context, the
        same for every layer (only its keys/values enter, through this layer's k/v_proj)."""
        bt, nb, _ = h.shape
        n, block = anchors.shape[1], nb // anchors.shape[1]
        attn = self.self_attn
        x = self.input_layernorm(h)
        q = attn.queries(x, rope_blk)
        kb, vb = attn.keys_values(x, rope_blk)
        kc, vc = attn.keys_values(ctx, rope_ctx)
        heads, d = q.shape[1], q.shape[-1]
        o = block_attention(
            q.view(bt, heads, n, block, d),
            kc,
            vc,
            kb.view(bt, heads, n, block, d),
            vb.view(bt, heads, n, block, d),
            anchors,
            backend=attn.backend,
        )
        h = h + attn.o_proj(o.view(bt, heads, nb, d).transpose(1, 2).reshape(bt, nb, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    def __init__(
        self, s: DFlashShape, target: TargetDescription, embed: nn.Module, lm_head: nn.Module
    ) -> None:
        super().__init__()
        self.shape = s
        self.fc = nn.Linear(s.num_features * s.target_hidden_size, s.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.layers = nn.ModuleList([DecoderLayer(s) for _ in range(s.num_layers)])
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.rotary = rotary_embedding(target)  # the target's RoPE, scaling included
        # A tuple, not attributes: nn.Module would register them as the draft's own.
        self._shared = (embed, lm_head)

    def forward(self, aux: Tensor, input_ids: Tensor, anchors: Tensor) -> Tensor:
        """``aux`` (Bt,T,n*TH) target features; ``input_ids`` (Bt,T); ``anchors`` (Bt,N)
        positions in 0..T-1. Returns the normed hidden (Bt, N, B, H) of every block slot."""
        s = self.shape
        bt, length = input_ids.shape
        n = anchors.shape[1]
        ctx = self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))  # (Bt,T,H)
        tokens = torch.full(
            (bt, n, s.block_size), s.mask_token_id, dtype=input_ids.dtype, device=input_ids.device
        )
        tokens[:, :, 0] = input_ids.gather(1, anchors)
        embed, _ = self._shared
        h = embed(tokens.view(bt, n * s.block_size)).to(self.fc.weight.dtype)
        pos_ctx = torch.arange(length, device=input_ids.device).expand(bt, length)
        pos_blk = block_positions(anchors, s.block_size).view(bt, n * s.block_size)
        rope_ctx, rope_blk = self.rotary(ctx, pos_ctx), self.rotary(h, pos_blk)
        for layer in self.layers:
            h = layer(h, ctx, anchors, rope_ctx, rope_blk)
        return self.norm(h).view(bt, n, s.block_size, -1)

    @property
    def vocab_size(self) -> int:
        """Rows of the target's head: the vocabulary ``logits`` scores."""
        return int(self._shared[1].weight.shape[0])

    @property
    def head_weight(self) -> Tensor:
        """(V, H) the target's frozen head (bias-free, as in the targets vLLM's DFlash serves)."""
        head = self._shared[1]
        assert getattr(head, "bias", None) is None, "DFlash's shared head has no bias"
        weight = head.weight
        assert isinstance(weight, Tensor)
        return weight

    def logits(self, hidden: Tensor) -> Tensor:
        """The target's frozen head on draft hidden states (gradients flow to the hidden)."""
        _, head = self._shared
        return head(hidden.to(head.weight.dtype))
