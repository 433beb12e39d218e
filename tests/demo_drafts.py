"""The demo config's draft of each algorithm, built on a tiny random fp32 target."""

from __future__ import annotations

import torch
import transformers as T
from conftest import REPO
from draft_cases import has_field, loss_from_data

from eagle_train.config import load_config
from eagle_train.data.vocab import build_vocab_mapping
from eagle_train.drafts.registry import get_draft
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget

VOCAB = 256


def demo_draft(algorithm: str, family: str, sets: tuple[str, ...] = ()):
    """(config, spec, tiny target, draft in train mode) of the algorithm's demo config on a
    tiny random fp32 target of ``family``, with a draft vocabulary where the draft uses one."""
    sets = ["data.train=unused", "target.dtype=float32", *sets]
    if has_field(algorithm, "mask_token_id"):
        sets.append("draft.mask_token_id=3")
    if loss_from_data(algorithm):
        sets.append("draft.loss=hard_ce")
    cfg = load_config(
        RunConfig, REPO / "configs" / "train" / f"{algorithm}-{family}-demo.yaml", sets
    )
    spec = get_draft(algorithm)
    target = tiny_target(family)
    vocab = build_vocab_mapping(torch.arange(VOCAB).flip(0), 128) if spec.uses_draft_vocab else None
    return cfg, spec, target, spec.build(cfg.draft, target, vocab).train()


def tiny_target(family: str) -> FrozenTarget:
    torch.manual_seed(0)
    cls, model = {
        "llama": (T.LlamaConfig, T.LlamaForCausalLM),
        "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM),
    }[family]
    config = cls(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=False,
    )
    return FrozenTarget(model(config))
