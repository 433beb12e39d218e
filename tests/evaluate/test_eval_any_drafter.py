"""eval-acceptance reads every drafter layout vLLM serves, as vLLM reads it, from golden
drafters written by the other tools' own code (tests/assets/drafters/make_drafters.py and
tests/assets/speculators/make_fixture.py), and compares the target each names with --target."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from run_configs import target_path

from eagle_train.drafts.layouts import read_layout
from eagle_train.evaluate.drafter import DrafterError, inspect_drafter
from eagle_train.evaluate.engine_choice import choose_engine
from eagle_train.target_model import load_target_description

ASSETS = Path(__file__).resolve().parents[1] / "assets"
GOLDEN = {
    # name: (directory, layout, draft algorithm, vLLM's speculative_config less the model)
    "speculators-eagle3": (
        ASSETS / "speculators" / "eagle3-llama-tiny",
        "speculators",
        "eagle3",
        {"method": "eagle3", "num_speculative_tokens": 3},
    ),
    "speculators-peagle": (
        ASSETS / "drafters" / "speculators-peagle",
        "speculators",
        "peagle",
        {"method": "eagle3", "num_speculative_tokens": 4, "parallel_drafting": True},
    ),
    "speculators-dflash": (
        ASSETS / "drafters" / "speculators-dflash",
        "speculators",
        "dflash",
        {"method": "dflash", "num_speculative_tokens": 3},
    ),
    "speculators-dflash-vocab": (
        ASSETS / "drafters" / "speculators-dflash-vocab",
        "speculators",
        "dflash",
        {"method": "dflash", "num_speculative_tokens": 3},
    ),
    "safeailab-eagle1": (
        ASSETS / "drafters" / "safeailab-eagle1",
        "safeailab",
        "eagle1",
        {"method": "eagle", "num_speculative_tokens": 2},
    ),
    "safeailab-eagle3": (
        ASSETS / "drafters" / "safeailab-eagle3",
        "safeailab",
        "eagle3",
        {"method": "eagle3", "num_speculative_tokens": 2},
    ),
    "zlab-dflash": (
        ASSETS / "drafters" / "zlab-dflash",
        "native",
        "dflash",
        {"method": "dflash", "num_speculative_tokens": 3},  # block_size 4 - 1
    ),
}
# K given on the command line for the layouts that do not record it (SafeAILab's).
K_GIVEN = {"safeailab-eagle1": 2, "safeailab-eagle3": 2}


def llama(world: Path) -> Path:
    return target_path(world)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_each_layout_is_read_as_vllm_serves_it(name: str, wide_world: Path, tmp_path: Path) -> None:
    path, layout, algorithm, serving = GOLDEN[name]
    found = read_layout(path)
    assert (found.layout, found.spec.name) == (layout, algorithm)
    if name == "safeailab-eagle3":  # servable next to the 4-layer target once it names
        path = with_aux_ids(foreign_copy(name, tmp_path))  # its aux layers (test below)
    info = inspect_drafter(
        path, load_target_description(llama(wide_world)), K_GIVEN.get(name), llama(wide_world)
    )
    assert info.speculative_config() == {**serving, "model": str(path)}
    assert info.source["target_check"] == "matches"
    if layout == "speculators":
        assert info.source["made_by"] == "speculators 0.9.0"
    else:  # provenance the drafter does not carry is unknown, not required
        assert info.source["made_by"] == "unknown"
        assert info.source["verifier"] == "unknown"


@pytest.mark.parametrize("name", sorted(n for n in GOLDEN if GOLDEN[n][1] == "speculators"))
def test_speculators_configs_read_as_vllm_reads_them(name: str) -> None:
    """The native config and speculative_config against vLLM's own speculators loader."""
    pytest.importorskip("vllm")
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    path = GOLDEN[name][0]
    raw = json.loads((path / "config.json").read_text())
    theirs = SpeculatorsConfig.extract_transformers_pre_trained_config(json.loads(json.dumps(raw)))
    serving = SpeculatorsConfig.extract_vllm_speculative_config(json.loads(json.dumps(raw)))
    found = read_layout(path)
    assert found.serving == serving
    for key, value in theirs.items():
        if key in ("architectures", "target_hidden_size") or value is None:
            continue  # vLLM picks its class by method; None: the draft's own hidden size
        ours = {"pard_token": "mask_token_id"}.get(key, key)  # P-EAGLE's mask, vLLM's name
        assert found.native.get(ours) == value, key


def test_tensors_as_vllm_loads_them() -> None:
    """SafeAILab's midlayer is vLLM's layers.0, t2d is skipped, mask_hidden is viewed flat."""
    safeailab = read_layout(GOLDEN["safeailab-eagle3"][0])
    shipped = torch.load(
        GOLDEN["safeailab-eagle3"][0] / "pytorch_model.bin", weights_only=True, mmap=True
    )
    assert "midlayer.self_attn.q_proj.weight" in shipped and "t2d" in shipped
    assert safeailab.tensors["layers.0.self_attn.q_proj.weight"][0] == (64, 128)
    assert not any(n.startswith("midlayer.") for n in safeailab.tensors)
    assert "t2d" not in safeailab.tensors and safeailab.skipped == ["t2d"]
    dflash = read_layout(GOLDEN["speculators-dflash-vocab"][0])  # its own head and d2t
    assert dflash.tensors["lm_head.weight"][0] == (128, 64) and dflash.skipped == ["t2d"]
    peagle = read_layout(GOLDEN["speculators-peagle"][0])
    assert peagle.tensors["mask_hidden"][0] == (3 * 64,)  # shipped as [1, 1, 192]


def foreign_copy(name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(GOLDEN[name][0], out)
    return out


def with_aux_ids(path: Path) -> Path:
    config = json.loads((path / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_fc_bias_of_an_unconverted_eagle1_is_refused(wide_world: Path, tmp_path: Path) -> None:
    """vLLM's EAGLE-1 drafter has no fc bias: a SafeAILab checkpoint trained with one fails
    in vLLM's loader, so the check names it before any engine starts."""
    path = foreign_copy("safeailab-eagle1", tmp_path)
    state = torch.load(path / "pytorch_model.bin", weights_only=True)
    state["fc.bias"] = torch.randn(64)
    torch.save(state, path / "pytorch_model.bin")
    with pytest.raises(DrafterError, match="unexpected tensor fc.bias"):
        inspect_drafter(path, load_target_description(llama(wide_world)), 2)


def test_eagle3_without_aux_layer_ids_on_a_shallow_target(wide_world: Path, tmp_path: Path) -> None:
    """SafeAILab's EAGLE-3 names no aux layers: vLLM feeds it the target's default layers
    (2, L//2, L-3), on the 4-layer tiny target (2, 2, 1), 2 distinct, while its fc reads 3
    (vLLM failed at the first request: "shape '[-1, 192]' is invalid"). Refused before any
    engine starts; naming the layers in config.json makes it servable."""
    path = foreign_copy("safeailab-eagle3", tmp_path)
    desc = load_target_description(llama(wide_world))
    with pytest.raises(DrafterError, match=r"\[2, 2, 1\], 2 distinct, but the drafter's fc"):
        inspect_drafter(path, desc, 2)
    config = json.loads((path / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    (path / "config.json").write_text(json.dumps(config))
    assert inspect_drafter(path, desc, 2).method == "eagle3"


def test_drafter_for_another_target_is_refused_or_overridden(wide_world: Path) -> None:
    """The qwen3 tiny target has the same vocabulary and sizes as the llama one the
    speculators drafter names: refused in one line, measured with allow_other_target."""
    qwen3 = target_path(wide_world, "qwen3")
    desc = load_target_description(qwen3)
    path = GOLDEN["speculators-eagle3"][0]
    with pytest.raises(DrafterError) as refused:
        inspect_drafter(path, desc, None, qwen3)
    message = str(refused.value)
    assert "\n" not in message and "LlamaForCausalLM" in message
    assert "allow_other_target=true" in message
    info = inspect_drafter(path, desc, None, qwen3, allow_other_target=True)
    assert info.source["target_check"].startswith("overridden: made for")


def test_named_verifier_directory_is_compared(wide_world: Path, tmp_path: Path) -> None:
    """A verifier named by a local directory whose config differs from --target's."""
    path = foreign_copy("speculators-peagle", tmp_path)
    config = json.loads((path / "config.json").read_text())
    other = tmp_path / "other-llama"
    shutil.copytree(llama(wide_world), other)
    changed = json.loads((other / "config.json").read_text())
    changed["rope_theta"] = 5e5
    (other / "config.json").write_text(json.dumps(changed))
    config["speculators_config"]["verifier"]["name_or_path"] = str(other)
    (path / "config.json").write_text(json.dumps(config))
    desc = load_target_description(llama(wide_world))
    with pytest.raises(DrafterError, match="config.json differs from the target's"):
        inspect_drafter(path, desc, None, llama(wide_world))
    (other / "config.json").write_text((llama(wide_world) / "config.json").read_text())
    assert inspect_drafter(path, desc, None, llama(wide_world)).source["target_check"] == (
        "matches"
    )


def test_engine_choice(wide_world: Path) -> None:
    target = llama(wide_world)
    config = json.loads((target / "config.json").read_text())
    choice = choose_engine(
        target_dir=target,
        dtype="float32",
        max_position_embeddings=512,
        longest_request=300,
        max_new_tokens=100,
        max_k=4,
        max_model_len=None,
        kv_cache_memory_bytes=None,
        cuda=False,
        environ={"OMP_NUM_THREADS": "2"},
    )
    assert choice.max_model_len == 404
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    one_request = -(-404 // 128) * 128 * per_token * 2  # target + drafter headroom
    assert choice.kv_cache_memory_bytes == max(256 * 2**20, one_request)
    assert choice.env_kept == {"OMP_NUM_THREADS": "2"}  # the user's value wins
    assert choice.env["NUMBA_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" not in choice.env
    capped = choose_engine(
        target_dir=target,
        dtype="float32",
        max_position_embeddings=512,
        longest_request=500,
        max_new_tokens=100,
        max_k=4,
        max_model_len=None,
        kv_cache_memory_bytes=None,
        cuda=True,
        environ={},
    )
    assert capped.max_model_len == 512 and "capped" in capped.max_model_len_reason
    assert capped.kv_cache_memory_bytes is None and capped.env == {}


def test_report_prints_engine_settings_and_each_drafters_source() -> None:
    from eagle_train.evaluate.engine_choice import EngineChoice
    from eagle_train.evaluate.report import to_markdown

    row = {
        "requests": 2,
        "tokens_per_target_step": 1.5,
        "mean_request_tokens_per_target_step": 1.5,
        "acceptance_length": 1.5,
        "drafted_step_share": 1.0,
        "tokens_per_s": 10.0,
        "speedup": None,
        "per_position_rate": [0.5],
    }
    engine = EngineChoice(
        300,
        "longest prompt 281 + max_new_tokens 16 + K 3",
        256 * 2**20,
        {"NUMBA_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"},
        {"OMP_NUM_THREADS": "1"},
    )
    source = {
        "layout": "safeailab",
        "made_by": "unknown",
        "verifier": "unknown",
        "target_check": "matches",
        "skipped_tensors": ["t2d"],
    }
    drafter = {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "overall": row,
        "turns": {"1": row},
        "categories": {"writing": row},
        "speedup": None,
        "greedy_equal_to_target": None,
        "reproducible": None,
        "source": source,
    }
    summary = {
        "target": "T",
        "prompts": "mt_bench",
        "turns": 1,
        "sampling": {"label": "greedy (temperature 0)"},
        "baseline_tokens_per_s": 12.0,
        "drafters": {"D": drafter},
        "paired": [],
        "engine": engine.to_dict(),
    }
    md = to_markdown(summary)
    assert (
        "Engine: max_model_len 300 (longest prompt 281 + max_new_tokens 16 + K 3); KV 256 MiB; "
        "set: NUMBA_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=0; kept: OMP_NUM_THREADS=1"
    ) in md
    assert (
        "## D (eagle3, K=3)\n\nDrafter: safeailab layout, written by unknown, for target "
        "unknown (matches); tensors vLLM skips: t2d\n\n| category |"
    ) in md
