"""The EAGLE-1 draft: fc over cat(embedding of x_{t+1}, target feature f_t), plain Llama
decoder layers, no final norm; tokens come from the target's frozen lm_head.

Parameter names are vLLM's EAGLE-1 names (``fc``, ``layers.i.*``), so export is a filter.
The embedding and lm_head are frozen copies of the target's (never exported: vLLM always
uses the target's). Its layers are the family's plain pre-norm ``DecoderLayer``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from eagle_train.drafts.common import rotary_embedding
from eagle_train.drafts.eagle_family import DecoderLayer, DraftShape, LayerKV, shift_left
from eagle_train.target_model import TargetDescription


class Eagle1Draft(nn.Module):
    def __init__(self, s: DraftShape, target: TargetDescription, num_layers: int) -> None:
        super().__init__()
        self.shape = s
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)  # frozen target copy
        self.fc = nn.Linear(2 * s.hidden_size, s.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(s, input_norm=i > 0) for i in range(num_layers)])
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)  # frozen target copy
        self.rotary = rotary_embedding(target)

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
