"""Tiny Llama-family and Qwen3-family demo targets, briefly pretrained on the demo corpus.

A random-init target gives near-uniform logits and every draft looks alike, so the targets
are trained (a fixed number of steps, so the build is deterministic) on the rendered chats.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from eagle_train.config import StrictModel

log = logging.getLogger(__name__)

Family = Literal["llama", "qwen3"]


class TargetShape(StrictModel):
    hidden_size: int = Field(default=128, ge=2, le=1 << 14)
    """The demo targets' hidden size."""
    intermediate_size: int = Field(default=384, ge=1, le=1 << 16)
    """The MLP's inner size."""
    num_hidden_layers: int = Field(default=4, ge=1, le=256)
    """Decoder layers (4: vLLM's default EAGLE-3 aux layers collide below 7, so the demo
    configs set draft.aux_layer_ids)."""
    num_attention_heads: int = Field(default=4, ge=1)
    """Query heads per layer."""
    num_key_value_heads: int = Field(default=2, ge=1)
    """Key/value heads per layer (grouped-query attention)."""
    max_position_embeddings: int = Field(default=2048, ge=8, le=1 << 20)
    """The longest context the targets are configured for (tokens)."""

    @model_validator(mode="after")
    def _heads_divide(self) -> TargetShape:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} does not divide hidden_size "
                f"{self.hidden_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads {self.num_key_value_heads} does not divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        return self


class PretrainConfig(StrictModel):
    steps: int = Field(default=400, ge=1)
    """Pretraining steps of each demo target on the demo corpus."""
    batch_size: int = Field(default=16, ge=1)
    """Sequences per pretraining step."""
    seq_len: int = Field(default=256, ge=2)
    """Tokens per pretraining sequence (the corpus is packed into them)."""
    lr: float = Field(default=3e-3, gt=0)
    """Pretraining's peak learning rate (AdamW)."""
    warmup_steps: int = Field(default=20, ge=0)
    """Pretraining's linear warm-up steps."""


def target_config(
    family: Family, shape: TargetShape, vocab_size: int, bos: int, eos: int, pad: int
) -> PretrainedConfig:
    """The HF config of a demo target of the given family, sized by ``shape``."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    if family == "llama":
        return LlamaConfig(**common)
    return Qwen3Config(head_dim=shape.hidden_size // shape.num_attention_heads, **common)


def build_target(
    family: Family, shape: TargetShape, tokenizer: PreTrainedTokenizerBase, seed: int
) -> PreTrainedModel:
    """A randomly initialised fp32 target of the given family, sized by ``shape``."""
    config = target_config(
        family,
        shape,
        len(tokenizer),
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model_cls = LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM
    return model_cls(config).float()


def pack_tokens(texts: list[str], tokenizer: PreTrainedTokenizerBase, seq_len: int) -> torch.Tensor:
    """Concatenate the tokenised texts and cut them into ``(N, seq_len)`` rows."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    num_rows = len(ids) // seq_len
    if num_rows == 0:
        raise ValueError(f"demo corpus too small: {len(ids)} tokens < seq_len {seq_len}")
    return torch.tensor(ids[: num_rows * seq_len], dtype=torch.long).view(num_rows, seq_len)


def pretrain(
    model: PreTrainedModel,
    rows: torch.Tensor,
    cfg: PretrainConfig,
    seed: int,
    reserved: range = range(0),
) -> float:
    """Next-token pretraining for a fixed number of steps; returns the final loss.

    ``reserved``: ids the tokenizer never produces (demo/tokenizer.py). Their head rows are
    tied to one row while training (``_loss``), then copied to all of them: the full
    vocabulary's loss at the cost of the others' ids."""
    if len(reserved):  # the tied row starts at the reserved rows' mean (about zero), as
        with torch.no_grad():  # their joint softmax term does; a random row would pull h
            model.lm_head.weight[reserved.start] = model.lm_head.weight[reserved].mean(0)
    if cfg.steps == 0:
        _tie_reserved(model, reserved)
        return math.nan
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    start, loss_value = time.perf_counter(), math.nan
    for step in range(cfg.steps):
        batch = rows[torch.randint(len(rows), (cfg.batch_size,), generator=gen)]
        loss = _loss(model, batch, reserved)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if step % 50 == 0 or step == cfg.steps - 1:
            log.info(
                "pretrain step %d/%d loss %.3f (%.0fs)",
                step + 1,
                cfg.steps,
                loss_value,
                time.perf_counter() - start,
            )
    model.eval()
    _tie_reserved(model, reserved)
    return loss_value


def _loss(model: PreTrainedModel, batch: torch.Tensor, reserved: range) -> torch.Tensor:
    """Next-token cross-entropy over the whole vocabulary, the reserved ids' head rows all
    equal to the first of them: their softmax term is that row's logit plus log(count), so
    the logits are computed for the other ids and that one row (exact for the tied head)."""
    if len(reserved) < 2:
        return model(input_ids=batch, labels=batch).loss
    hidden = model.model(input_ids=batch).last_hidden_state
    weight = model.lm_head.weight
    rows = torch.cat([weight[: reserved.start + 1], weight[reserved.stop :]])
    # The tied row's gradient is the sum of the reserved rows'; scaled to their joint norm
    # (1/sqrt(count)) so that it does not dominate the clipped gradient norm as no untied
    # row would (Adam's per-parameter step is unchanged by the scale).
    scale = torch.ones(len(rows), 1)
    scale[reserved.start] = len(reserved) ** -0.5
    rows.register_hook(lambda grad: grad * scale)
    bias = torch.zeros(len(rows), dtype=hidden.dtype)
    bias[reserved.start] = math.log(len(reserved))
    logits = hidden[:, :-1] @ rows.T + bias
    labels = batch[:, 1:]
    labels = torch.where(labels >= reserved.stop, labels - (len(reserved) - 1), labels)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


@torch.no_grad()
def _tie_reserved(model: PreTrainedModel, reserved: range) -> None:
    """Every reserved id's head row set to the first one's (the one ``_loss`` trained)."""
    if len(reserved):
        weight = model.lm_head.weight
        weight[reserved.start : reserved.stop] = weight[reserved.start].clone()


def save_target(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path, dtype: torch.dtype
) -> None:
    """``save_pretrained`` in ``dtype`` with the tokenizer and a greedy generation config."""
    out = model.to(dtype)
    out.config.dtype = dtype
    out.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    out.save_pretrained(path)
    tokenizer.save_pretrained(path)
