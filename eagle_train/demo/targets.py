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
    hidden_size: int = 128
    """The demo targets' hidden size."""
    intermediate_size: int = 384
    """The MLP's inner size."""
    num_hidden_layers: int = 4
    """Decoder layers (4: vLLM's default EAGLE-3 aux layers collide below 7, so the demo
    configs set draft.aux_layer_ids)."""
    num_attention_heads: int = 4
    """Query heads per layer."""
    num_key_value_heads: int = 2
    """Key/value heads per layer (grouped-query attention)."""
    max_position_embeddings: int = 2048
    """The longest context the targets are configured for (tokens)."""


class PretrainConfig(StrictModel):
    steps: int = 400
    """Pretraining steps of each demo target on the demo corpus."""
    batch_size: int = 16
    """Sequences per pretraining step."""
    seq_len: int = 256
    """Tokens per pretraining sequence (the corpus is packed into them)."""
    lr: float = 3e-3
    """Pretraining's peak learning rate (AdamW)."""
    warmup_steps: int = 20
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


def pretrain(model: PreTrainedModel, rows: torch.Tensor, cfg: PretrainConfig, seed: int) -> float:
    """Next-token pretraining for a fixed number of steps; returns the final loss."""
    if cfg.steps == 0:
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
        loss = model(input_ids=batch, labels=batch).loss
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
    return loss_value


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
