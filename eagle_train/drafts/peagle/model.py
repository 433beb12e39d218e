"""The P-EAGLE draft: the family's fused first layer and fc (EAGLE-3.1's norms optional), then
(n-1) ordinary decoder layers, a learnable ``mask_hidden`` (pre-fc aux space) and a learnable
embedding row for the mask token. One forward computes every sampled (anchor, depth) element.

Parameter names follow vLLM's EAGLE-3 loader (``fc``, ``layers.i.*``, ``norm``, ``lm_head``,
``mask_hidden``); the mask row lives in ``mask_embedding`` beside the frozen target embedding
and is written into ``embed_tokens`` at export.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from eagle_train.drafts import kernels
from eagle_train.drafts.common import RMSNorm, rotary_embedding
from eagle_train.drafts.eagle_family import DecoderLayer, DraftShape, FusedInput, FusedLayer
from eagle_train.drafts.peagle.config import PEagleConfig
from eagle_train.drafts.peagle.sampling import Elements, attention_mask, block_mask
from eagle_train.target_model import TargetDescription


class PEagleDraft(FusedInput):
    def __init__(self, s: DraftShape, target: TargetDescription, cfg: PEagleConfig) -> None:
        super().__init__()
        self.shape = s
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)  # frozen target copy
        self.mask_embedding = nn.Parameter(torch.zeros(s.hidden_size))
        self.mask_hidden = nn.Parameter(torch.zeros(s.num_aux * s.target_hidden_size))
        self.build_fusion(s, cfg.norm_before_fc, cfg.fc_norm)  # fc, EAGLE-3.1's norms
        self.layers = nn.ModuleList(
            [FusedLayer(s)] + [DecoderLayer(s) for _ in range(cfg.num_layers - 1)]
        )
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.lm_head = nn.Linear(s.hidden_size, s.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(s.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(s.vocab_size, dtype=torch.bool))
        self.register_buffer("mask_token_id", torch.zeros((), dtype=torch.long))
        self.rotary = rotary_embedding(target)
        self.attention = "auto"  # dense or flex (draft.attention), a plain attribute

    def forward(self, aux: Tensor, input_ids: Tensor, e: Elements, head: bool = True) -> Tensor:
        """``aux`` (B,T,n*TH), ``input_ids`` (B,T); returns (B,M,Vd) logits of the elements
        ``e`` (element (a, d) predicts x_{a+2+d}), or with ``head`` False the (B,M,H)
        final-normed hidden state the head reads (the training loss applies the head in
        chunks: drafts/vocab_loss.py)."""
        t = input_ids.shape[1]
        deep = (e.depth > 0)[..., None]  # (B,M,1)
        aux_e = aux.gather(1, e.anchor[..., None].expand(-1, -1, aux.shape[-1]))
        # torch.where keeps mask_hidden and mask_embedding in every graph, even one without
        # a deep element: under DDP (find_unused_parameters=False) each backward must reach
        # every trainable parameter (they then get a zero gradient).
        # mask_hidden goes through the norms and fc like the aux features (vLLM's proposer
        # passes it through combine_hidden_states)
        g = self.fuse(torch.where(deep, self.mask_hidden.to(aux_e.dtype), aux_e))
        tokens = input_ids.gather(1, (e.anchor + 1).clamp(max=t - 1))
        emb = torch.where(deep, self.mask_embedding.to(g.dtype), self.embed_tokens(tokens))
        rope = self.rotary(g, e.anchor + e.depth)
        flex = kernels.resolve(self.attention, input_ids.device, cpu_default="dense") == "flex"
        mask = block_mask(e) if flex else attention_mask(e)
        first = self.layers[0]
        x = torch.cat([first.input_layernorm(emb), first.hidden_norm(g)], dim=-1)
        q, k, v = first.self_attn.project(x, rope)
        attn = kernels.masked_attention(q, k, v, mask)
        b, _, m, _ = attn.shape
        h = g + first.self_attn.o_proj(attn.transpose(1, 2).reshape(b, m, -1))
        h = h + first.mlp(first.post_attention_layernorm(h))
        for layer in self.layers[1:]:
            h = layer(h, rope, mask)
        normed = self.norm(h)
        return self.lm_head(normed) if head else normed
