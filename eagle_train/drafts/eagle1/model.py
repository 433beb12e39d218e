"""The EAGLE-1 draft: fc over cat(embedding of x_{t+1}, target feature f_t), plain Llama
decoder layers, no final norm; tokens come from the target's frozen lm_head.

Parameter names are vLLM's EAGLE-1 names (``fc``, ``layers.i.*``), so export is a filter.
The embedding and lm_head are frozen copies of the target's (never exported: vLLM always
uses the target's). ``DecoderLayer`` is the plain pre-norm Llama layer; P-EAGLE reuses it for
its layers after the fused first one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from eagle_train.drafts import kernels
from eagle_train.drafts.common import RMSNorm
from eagle_train.drafts.eagle3.attention import ttt_attention
from eagle_train.drafts.eagle3.model import MLP, Attention, DraftShape, shift_left

# A key/value list per layer: entry j holds the (k, v) of chain step j (see ttt_attention).
LayerKV = list[tuple[Tensor, Tensor]]


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
    ) -> Tensor:
        """``h`` (B,N,H). Attention: ``mask`` (B,1,N,N) bool (True = may attend) or a flex
        BlockMask; None and
        no ``kv`` = causal; with ``kv`` = a training-time-test chain step (keys appended)."""
        x = h if self.input_layernorm is None else self.input_layernorm(h)
        q, k, v = self.self_attn.project(x, rope)
        if kv:  # chain step >= 1: causal step-0 keys + this slot's own chain
            kd = torch.stack([kj for kj, _ in kv[1:]] + [k], dim=3)
            vd = torch.stack([vj for _, vj in kv[1:]] + [v], dim=3)
            attn = ttt_attention(q, kv[0][0], kv[0][1], kd, vd, self.self_attn.backend)
        else:
            attn = kernels.masked_attention(q, k, v, mask)
        if kv is not None:
            kv.append((k, v))
        b, _, n, _ = attn.shape
        h = h + self.self_attn.o_proj(attn.transpose(1, 2).reshape(b, n, -1))
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle1Draft(nn.Module):
    def __init__(self, s: DraftShape, target: PretrainedConfig, num_layers: int) -> None:
        super().__init__()
        self.shape = s
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)  # frozen target copy
        self.fc = nn.Linear(2 * s.hidden_size, s.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(s, input_norm=i > 0) for i in range(num_layers)])
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)  # frozen target copy
        self.rotary = LlamaRotaryEmbedding(target)

    def forward(self, feature: Tensor, input_ids: Tensor, num_steps: int = 1) -> list[Tensor]:
        """``feature`` (B,T,H) the target's final-normed hidden f_t; ``input_ids`` (B,T) x.

        Step k at slot t reads token x_{t+1+k} at RoPE position t+k and, for k >= 1, its own
        step-(k-1) output as the feature; it attends the step-0 keys of slots <= t plus its
        own chain (what vLLM does when it chains drafts). Returns per step the predicted
        feature (B,T,H) of position t+1+k (its logits predict x_{t+2+k}).
        """
        b, t = input_ids.shape
        base = torch.arange(t, device=input_ids.device).expand(b, t)
        kv: list[LayerKV] = [[] for _ in self.layers]
        out = []
        for k in range(num_steps):
            h = self.fc(torch.cat([self.embed_tokens(shift_left(input_ids, 1 + k)), feature], -1))
            rope = self.rotary(h, base + k)
            for layer, layer_kv in zip(self.layers, kv, strict=True):
                h = layer(h, rope, kv=layer_kv)
            out.append(h)
            feature = h
        return out
