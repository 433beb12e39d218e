"""Every field vLLM reads from an exported drafter's config.json comes from the target: tiny
random targets whose norm eps, RoPE base and scaling, head_dim, position limit, tied head and
vocabulary size all differ from the library defaults (and from every other test target), each
algorithm's drafter exported for them, and the written config read back with vLLM's own
loader (``vllm.transformers_utils.config.get_config``), compared with the target's HF config
(a hard-coded constant, or a value taken from the wrong place, fails here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers as T
from conftest import REPO
from draft_cases import ALGORITHMS, has_field

from eagle_train.config import load_config
from eagle_train.data.vocab import build_vocab_mapping
from eagle_train.drafts.registry import get_draft
from eagle_train.export import export_state
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget

VOCAB, DRAFT_VOCAB = 320, 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,  # not hidden_size / heads (16)
    max_position_embeddings=777,
    bos_token_id=5,
    eos_token_id=6,
    pad_token_id=7,
)
CONFIGS = {
    "llama": lambda: T.LlamaConfig(
        **_COMMON,
        rms_norm_eps=3e-5,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 123456.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    ),
    "qwen3": lambda: T.Qwen3Config(
        **_COMMON,
        rms_norm_eps=2.5e-7,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 54321.0,
            "factor": 2.0,
            "original_max_position_embeddings": 384,
        },
    ),
}
MODELS = {"llama": T.LlamaForCausalLM, "qwen3": T.Qwen3ForCausalLM}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def odd_target(request: pytest.FixtureRequest, tmp_path_factory) -> tuple[str, Path]:
    family = request.param
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("odd") / family
    MODELS[family](CONFIGS[family]()).save_pretrained(path)
    return family, path


def _export(algorithm: str, family: str, path: Path, out: Path) -> Path:
    sets = [f"target.path={path}", "target.dtype=float32", "data.train=unused"]
    if has_field(algorithm, "mask_token_id"):
        sets.append("draft.mask_token_id=9")
    if has_field(algorithm, "draft_vocab_size"):
        sets.append(f"draft.draft_vocab_size={DRAFT_VOCAB}")
    cfg = load_config(
        RunConfig, REPO / "configs" / "train" / f"{algorithm}-{family}-demo.yaml", sets
    )
    spec = get_draft(algorithm)
    target = FrozenTarget.from_pretrained(path, dtype=torch.float32)
    vocab = build_vocab_mapping(torch.arange(VOCAB).flip(0), DRAFT_VOCAB)
    draft = spec.build(cfg.draft, target, vocab if spec.uses_draft_vocab else None)
    return export_state(draft.state_dict(), cfg, out, {"step": 0})


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exported_config_carries_the_targets_values(
    algorithm: str, odd_target: tuple[str, Path], tmp_path: Path
) -> None:
    from vllm.transformers_utils.config import get_config

    family, path = odd_target
    out = _export(algorithm, family, path, tmp_path / "drafter")
    want = T.AutoConfig.from_pretrained(path)  # the target, as transformers reads it
    got = get_config(str(out), trust_remote_code=False)  # the drafter, as vLLM reads it
    for key in (
        "rms_norm_eps",
        "head_dim",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "max_position_embeddings",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
    ):
        assert getattr(got, key) == getattr(want, key), key
    assert got.rms_norm_eps == CONFIGS[family]().rms_norm_eps  # not a library default
    rope = dict(got.rope_parameters)
    for key, value in want.rope_parameters.items():
        assert rope.get(key) == value, f"rope_parameters[{key!r}]"
    # the drafter has a head of its own or borrows the target's: never tied to its embedding
    assert got.tie_word_embeddings is False
    if has_field(algorithm, "draft_vocab_size"):
        assert got.draft_vocab_size == DRAFT_VOCAB
