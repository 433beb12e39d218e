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

from eagle_train.drafts.common import RMSNorm, rotary_embedding
from eagle_train.drafts.eagle_family import DraftShape, FusedLayer, shift_left
from eagle_train.drafts.ttt_attention import ttt_attention
from eagle_train.target import TargetDescription


@dataclass
class DraftOutput:
    logits: list[Tensor]  # per TTT step: (B, T, Vd) at slot t, predicting x_{t+2+step}


class Eagle3Draft(nn.Module):
    def __init__(self, s: DraftShape, target: TargetDescription) -> None:
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
        self.rotary = rotary_embedding(target)  # the target's RoPE, scaling included

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
