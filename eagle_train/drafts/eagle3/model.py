"""The EAGLE-3 draft: fc over fused target features, a fused first decoder layer, (N-1)
ordinary decoder layers, own lm_head; optionally EAGLE-3.1's extra norms.

Parameter names are vLLM's EAGLE-3 names (``fc``, ``input_norm``, ``fc_norm.i``,
``layers.i.*``, ``norm``, ``lm_head``), so export is a filter and a dtype cast, not a rename.
As in vLLM's ``llama_eagle3.py`` only layer 0 reads ``cat(embedding, hidden)``; later layers
are pre-norm decoder layers over H. The module is single-device; DDP/FSDP wrap it from
outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle_train.drafts.common import RMSNorm, rotary_embedding
from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.eagle_family import (
    DecoderLayer,
    DraftShape,
    FusedInput,
    FusedLayer,
    LayerKV,
    after_attention,
    shift_left,
)
from eagle_train.drafts.ttt_attention import ttt_attention
from eagle_train.target_model import TargetDescription


@dataclass
class DraftOutput:
    # Per TTT step: (B, T, Vd) at slot t, predicting x_{t+2+step}; with ``head_at``, (N, Vd)
    # at that step's N selected slots only (row-major order). Empty when ``head`` is False.
    logits: list[Tensor]
    # Per TTT step, the final-normed hidden state the head reads, (B, T, H) or (N, H) as
    # ``logits`` (the training loss applies the head itself, chunk by chunk: vocab_loss.py).
    hidden: list[Tensor]
    # The copy heads' queries and keys (B, N, T, D) at each of the first ``copy_steps`` TTT
    # steps, rotary applied: what copy supervision trains (drafts/eagle3/copy_loss.py).
    copy_qk: list[tuple[Tensor, Tensor]]


class Eagle3Draft(FusedInput):
    def __init__(self, s: DraftShape, target: TargetDescription, cfg: Eagle3Config) -> None:
        super().__init__()
        self.shape = s
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.build_fusion(s, cfg.norm_before_fc, cfg.fc_norm)  # fc, EAGLE-3.1's norms
        self.layers = nn.ModuleList(
            [FusedLayer(s), *(DecoderLayer(s) for _ in range(cfg.num_layers - 1))]
        )
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.norm_output = cfg.norm_output  # next step's hidden: after the final norm
        self.lm_head = nn.Linear(s.hidden_size, s.draft_vocab_size, bias=False)
        # target_id = draft_id + d2t[draft_id]; t2d marks target ids inside the draft vocab.
        self.register_buffer("d2t", torch.zeros(s.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(s.vocab_size, dtype=torch.bool))
        self.rotary = rotary_embedding(target)  # the target's RoPE, scaling included
        # Copy heads: the last query head of each of the last copy_heads key/value groups, so
        # that each reads its own value (GQA shares one value per group).
        groups = s.num_heads // s.num_kv_heads
        self.copy_heads = [s.num_heads - 1 - g * groups for g in range(cfg.copy_heads)][::-1]

    def step(
        self,
        hidden: Tensor,
        tokens: Tensor,
        positions: Tensor,
        kv: list[LayerKV],
        probe: list[tuple[Tensor, Tensor]] | None = None,
        rows: Tensor | None = None,
    ) -> Tensor:
        """One TTT step. ``hidden`` (B,T,H) is fuse(aux) at step 0, else the previous step's
        output (pre- or post-norm, per ``norm_output``); ``tokens`` (B,T) the next
        ground-truth token of each slot. Each layer's keys are appended to its ``kv`` list;
        ``probe``, when given, receives the first layer's copy heads' queries and keys.
        ``rows`` (B,T) bool: the slots whose output this or a later step reads (None: all);
        the others are left out of every per-slot product but the keys that step 0's
        attention needs at every slot, and hold zeros. Returns this step's pre-norm output
        (B,T,H)."""
        first, last = not kv[0], len(self.layers) - 1
        layer = self.layers[0]
        x = torch.cat(
            [layer.input_layernorm(self.embed_tokens(tokens)), layer.hidden_norm(hidden)], dim=-1
        )
        rope = self.rotary(x, positions)
        q, k, v = layer.self_attn.project(x, rope, None if first else rows)
        if probe is not None:
            probe.append((q[:, self.copy_heads], k[:, self.copy_heads]))
        cache = kv[0]
        if first:  # step 0: plain causal attention over the real context
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # later steps: causal step-0 keys + this slot's chain (the diagonal)
            kd = torch.stack([kj for kj, _ in cache[1:]] + [k], dim=3)
            vd = torch.stack([vj for _, vj in cache[1:]] + [v], dim=3)
            attn = ttt_attention(q, cache[0][0], cache[0][1], kd, vd, layer.self_attn.backend)
        cache.append((k, v))
        b, _, t, _ = attn.shape
        # At step 0 a layer's output at every slot feeds the next layer's keys; the last
        # layer's only this step's head and the later steps.
        out_rows = rows if not first or last == 0 else None
        h = after_attention(layer, hidden, attn.transpose(1, 2).reshape(b, t, -1), out_rows)
        for i, (later, later_kv) in enumerate(zip(self.layers[1:], kv[1:], strict=True), 1):
            out_rows = rows if not first or i == last else None
            h = later(h, rope, None, later_kv, None if first else rows, out_rows)
        return h

    def forward(
        self,
        aux: Tensor,
        input_ids: Tensor,
        num_steps: int,
        copy_steps: int = 0,
        head_at: list[Tensor] | None = None,
        head: bool = True,
    ) -> DraftOutput:
        """``aux`` (B,T,n*TH) target features at slot t; ``input_ids`` (B,T) the sequence x.

        Step k at slot t takes token x_{t+1+k} at RoPE position t+k. Tokens past the end
        are padded with the last id; their slots are masked out by the loss. ``copy_steps``:
        also return the copy heads' queries and keys at that many first steps. ``head_at``:
        per step a (B,T) bool of the slots whose logits are wanted (training: the supervised
        ones); the head and every per-slot product whose result no wanted logit depends on
        then skip the prompt and padding slots (``needed_slots``). ``head``: apply the head
        (else ``logits`` is empty and the caller applies it to ``hidden``).
        """
        b, t = input_ids.shape
        hidden = self.fuse(aux)
        base = torch.arange(t, device=input_ids.device).expand(b, t)
        kv: list[LayerKV] = [[] for _ in self.layers]
        logits: list[Tensor] = []
        normed_at: list[Tensor] = []
        probe: list[tuple[Tensor, Tensor]] = []
        rows = None if head_at is None else needed_slots(head_at)
        for k in range(num_steps):
            tokens = shift_left(input_ids, 1 + k)
            out = self.step(
                hidden,
                tokens,
                base + k,
                kv,
                probe if k < copy_steps else None,
                None if rows is None else rows[k],
            )
            normed = self.norm(out)
            normed_at.append(normed if head_at is None else normed[head_at[k]])
            if head:
                logits.append(self.lm_head(normed_at[-1]))
            hidden = normed if self.norm_output else out
        return DraftOutput(logits=logits, hidden=normed_at, copy_qk=probe)


def needed_slots(head_at: list[Tensor]) -> list[Tensor]:
    """Per step k, (B,T) bool: the slots whose step-k output is read, by the head at k or,
    through the slot's own chain, at a later step (``head_at[k] | head_at[k+1] | ...``)."""
    rows = [head_at[-1]]
    for wanted in reversed(head_at[:-1]):
        rows.append(rows[-1] | wanted)
    return rows[::-1]
