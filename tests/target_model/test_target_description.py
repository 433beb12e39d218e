"""The target description: what every family's HF config says about the target, the draft's
RoPE equal to the target's own, and refusal before training of what vLLM cannot serve."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import transformers as T
from target_families import (
    EXPECTED,
    FAMILIES,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    KV_HEADS,
    LAYERS,
    VOCAB,
    family_config,
)

from eagle_train.drafts.common import rotary_embedding
from eagle_train.drafts.registry import check_servable, get_draft, served_methods
from eagle_train.target_model import TargetError, describe_target
from eagle_train.target_model.description import VLLM_CAPABILITIES


@pytest.mark.parametrize("family", FAMILIES)
def test_description_of_each_family(family: str) -> None:
    d = describe_target(family_config(family))
    want = EXPECTED[family]
    assert (d.num_layers, d.hidden_size, d.vocab_size) == (LAYERS, HIDDEN, VOCAB)
    assert (d.num_heads, d.num_kv_heads, d.head_dim) == (HEADS, KV_HEADS, HEAD_DIM)
    assert d.architecture == want["architecture"]
    assert d.qk_norm is want["qk_norm"] and d.num_experts == want["num_experts"]
    assert d.text_config_key == want.get("text_config_key")
    assert d.model_type == want.get("model_type", family)
    assert d.tied_head is False and d.default_aux_layer_ids == (2, 2, 1)
    assert d.capabilities == ("last_hidden_state", "aux_hidden_states")
    assert served_methods(d) == ["dflash", "dspark", "eagle", "eagle3"]


def test_rope_and_tied_head_read_from_the_config() -> None:
    gpt = describe_target(family_config("gpt_oss"))
    assert gpt.rope.type == "yarn" and gpt.rope.theta == 150000.0
    assert gpt.rope.parameters["factor"] == 4.0
    assert gpt.mirrored_fields()["rope_parameters"]["original_max_position_embeddings"] == 128
    vl = describe_target(family_config("qwen2_5_vl"))
    assert vl.rope.theta == 1e6 and vl.rope.parameters["mrope_section"] == [4, 6, 6]
    tied = describe_target(T.LlamaConfig(num_hidden_layers=30, tie_word_embeddings=True))
    assert tied.tied_head and tied.default_aux_layer_ids == (2, 15, 27)


def _target_rotary(family: str):
    config = family_config(family)
    if family == "qwen2_5_vl":
        text = T.Qwen2_5_VLForConditionalGeneration(config).model.language_model
        return text.rotary_emb, True
    return T.AutoModelForCausalLM.from_config(config).model.rotary_emb, False


@pytest.mark.parametrize("family", FAMILIES)
def test_draft_rope_equals_the_targets_own(family: str) -> None:
    """A draft that ignored YaRN scaling, the RoPE base or M-RoPE's text positions would
    rotate its queries and keys differently from the target that vLLM pairs it with."""
    target_rope, mrope = _target_rotary(family)
    draft_rope = rotary_embedding(describe_target(family_config(family)))
    x = torch.zeros(1, 300, HIDDEN)
    pos = torch.arange(300)[None]
    cos, sin = draft_rope(x, pos)
    want_cos, want_sin = target_rope(x, pos.expand(3, 1, 300) if mrope else pos)
    if want_cos.shape[-1] == HEAD_DIM // 2:  # gpt-oss keeps one half: the halves are equal
        want_cos, want_sin = torch.cat([want_cos] * 2, -1), torch.cat([want_sin] * 2, -1)
    assert torch.allclose(cos, want_cos, atol=1e-6) and torch.allclose(sin, want_sin, atol=1e-6)


def test_unservable_target_is_refused_with_the_alternatives() -> None:
    mixtral = describe_target(T.MixtralConfig(num_hidden_layers=4))
    with pytest.raises(TargetError) as exc:
        check_servable(get_draft("eagle3"), mixtral)
    message = str(exc.value)
    assert "MixtralForCausalLM" in message and "Methods this target can serve: none" in message
    assert "Qwen3MoeForCausalLM" in message and "GptOssForCausalLM" in message
    check_servable(get_draft("eagle3"), describe_target(family_config("qwen3_moe")))


def test_train_refuses_before_writing_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from eagle_train.cli import train_draft_app

    target = tmp_path / "mixtral"
    T.MixtralConfig(num_hidden_layers=4, vocab_size=512).save_pretrained(target)
    out = tmp_path / "run"
    config = Path(__file__).resolve().parents[2] / "configs" / "train" / "eagle3-llama-demo.yaml"
    result = CliRunner().invoke(
        train_draft_app,
        [
            "-c",
            str(config),
            "--set",
            f"target.path={target}",
            "--set",
            f"train.output_dir={out}",
            "--set",
            f"data.train={tmp_path / 'no-data'}",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "MixtralForCausalLM" in result.output and "LlamaForCausalLM" in result.output
    assert not out.exists()  # refused before the data, the target weights or the run dir


@pytest.mark.vllm
def test_capability_table_matches_installed_vllm() -> None:
    """Each architecture's row equals the interfaces its vLLM class implements (classes
    vLLM cannot import here, e.g. without torchvision, are checked from the source)."""
    from vllm.model_executor.models import interfaces
    from vllm.model_executor.models.registry import ModelRegistry

    unimportable = []
    for arch, caps in VLLM_CAPABILITIES.items():
        module_name, class_name = ModelRegistry.models[arch].module_name, arch
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except ImportError:
            unimportable.append(arch)
            source = Path(importlib.util.find_spec(module_name).origin).read_text()
            head = source[source.index(f"class {class_name}(") :].split("):", 1)[0]
            assert ("SupportsEagle3" in head) == ("aux_hidden_states" in caps), arch
            continue
        assert interfaces.supports_eagle(cls) == ("last_hidden_state" in caps), arch
        assert interfaces.supports_eagle3(cls) == ("aux_hidden_states" in caps), arch
    print("checked from source (not importable here):", unimportable)
