"""The DSpark draft: DFlash's parallel block backbone (``drafts/dflash``, reused as is) plus
two small heads, under vLLM's names (``qwen3_dspark.py``):

- ``markov_head``: a low-rank transition bias from the previous token, ``markov_w1`` (V x r,
  an embedding of the previous token) and ``markov_w2`` (V x r, its projection to a bias over
  the vocabulary), added to the backbone's logits slot by slot, left to right;
- ``confidence_head``: ``proj`` (1 x (H [+ r])) with a bias, the logit of the slot's
  acceptance from the slot's hidden state and (optionally) the previous token's embedding.

The backbone's block is ``[x_a, NOISE x (B-1)]``; unlike DFlash, every slot predicts: slot k
(0..B-1) predicts x_{a+k+1}, its previous token is x_{a+k} (the anchor for slot 0).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle_train.config import ConfigError
from eagle_train.drafts.dflash.model import DFlashDraft, DFlashShape
from eagle_train.target_model import TargetDescription


class MarkovHead(nn.Module):
    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        # A small transition at first (|bias| ~ 0.02): a fresh DSpark drafts almost as its
        # DFlash backbone does, and both factors get a gradient from the first step.
        nn.init.normal_(self.markov_w1.weight, std=rank**-0.5)
        nn.init.normal_(self.markov_w2.weight, std=0.02)

    def embed(self, prev: Tensor) -> Tensor:
        """(...,) previous token ids -> (..., r)."""
        return self.markov_w1(prev)

    def bias(self, embedding: Tensor) -> Tensor:
        """(..., r) -> (..., V) the transition bias."""
        return self.markov_w2(embedding)


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, rank: int, with_markov: bool) -> None:
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (rank if with_markov else 0), 1, bias=True)

    def forward(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        """The acceptance logit (...,) of each slot (vLLM applies the sigmoid), in fp32."""
        x = torch.cat([hidden, embedding], dim=-1) if self.with_markov else hidden
        bias = self.proj.bias.float() if self.proj.bias is not None else None
        return F.linear(x.float(), self.proj.weight.float(), bias).squeeze(-1)


class DSparkDraft(DFlashDraft):
    def __init__(
        self,
        s: DFlashShape,
        target: TargetDescription,
        embed: nn.Module,
        lm_head: nn.Module,
        markov_rank: int,
        confidence_head: bool,
        confidence_with_markov: bool,
    ) -> None:
        super().__init__(s, target, embed, lm_head)
        if markov_rank > s.hidden_size:
            raise ConfigError(
                f"draft.markov_rank {markov_rank} is larger than the draft's hidden size "
                f"{s.hidden_size}: a low-rank transition has rank at most the hidden size; "
                f"set draft.markov_rank to 1..{s.hidden_size}"
            )
        self.markov_head = MarkovHead(self.vocab_size, markov_rank)
        self.confidence_head = (
            ConfidenceHead(s.hidden_size, markov_rank, confidence_with_markov)
            if confidence_head
            else None
        )

    def slot_logits(self, hidden: Tensor, prev: Tensor) -> tuple[Tensor, Tensor]:
        """``hidden`` (..., H) backbone outputs, ``prev`` (...,) each slot's previous token:
        (fp32 logits (..., V) = head(hidden) + Markov bias, the Markov embedding (..., r))."""
        embedding = self.markov_head.embed(prev)
        bias = self.markov_head.bias(embedding)
        return self.logits(hidden).float() + bias.float(), embedding

    def confidence_logit(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        if self.confidence_head is None:
            raise ValueError("this DSpark draft has no confidence head (draft.confidence_head)")
        return self.confidence_head(hidden, embedding)
