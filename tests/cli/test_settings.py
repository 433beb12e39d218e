"""One schema per setting: the KV-cache default, the acceptance settings shared by
eval-acceptance and train.acceptance, the draft-vocabulary size (the draft's own knob), and
DFlash's loss target resolved from the training data, the q/k norm switch (once
draft.layer_style, whose old key is now unknown)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from draft_cases import ALGORITHMS, has_field
from run_configs import cli_args, run_sets
from transformers import LlamaForCausalLM, Qwen3ForCausalLM
from typer.testing import CliRunner

from eagle_train.checkpoint import stored_config
from eagle_train.cli import app, train_draft_app
from eagle_train.config import ConfigError, load_config
from eagle_train.demo.build import DemoConfig
from eagle_train.demo.targets import target_config
from eagle_train.drafts.registry import get_draft
from eagle_train.engine import VllmEngine, resolve_kv_cache_bytes
from eagle_train.evaluate.settings import AcceptanceSettings, EvalSettings, TrainAcceptance
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget
from eagle_train.train_setup import with_data_defaults

REPO = Path(__file__).resolve().parents[2]
QK_NORM = [a for a in ALGORITHMS if has_field(a, "qk_norm")]  # the drafts with the switch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU default")
def test_one_kv_cache_default_on_cpu() -> None:
    assert resolve_kv_cache_bytes(None) == 256 * 2**20
    assert resolve_kv_cache_bytes(1234) == 1234
    assert VllmEngine("m", dtype="float32").kwargs["kv_cache_memory_bytes"] == 256 * 2**20
    for model in (AcceptanceSettings, TrainAcceptance):
        assert model().kv_cache_memory_bytes is None  # i.e. the engine's default


def test_train_acceptance_is_the_eval_schema_nested() -> None:
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        ["target.path=t", "data.train=d", "train.acceptance.every=5"],
    )
    shared = set(AcceptanceSettings.model_fields)
    assert shared < set(TrainAcceptance.model_fields) and shared < set(EvalSettings.model_fields)
    assert cfg.train.acceptance.every == 5
    assert cfg.train.acceptance.max_new_tokens == AcceptanceSettings().max_new_tokens == 256
    with pytest.raises(ConfigError, match="train.acceptance.turns"):
        load_config(
            RunConfig,
            REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
            ["target.path=t", "data.train=d", "train.acceptance.turns=2"],
        )


@pytest.mark.parametrize("algorithm", ["eagle1", "dflash"])
def test_a_draft_without_a_draft_vocabulary_refuses_the_knob(algorithm: str) -> None:
    path = REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml"
    sets = ["target.path=t", "data.train=d", "draft.draft_vocab_size=64"]
    with pytest.raises(
        ConfigError,
        match=f"--set 'draft.draft_vocab_size=64': key 'draft.draft_vocab_size': the {algorithm} "
        "draft has no",
    ):
        load_config(RunConfig, path, sets)
    for draft in ("eagle3", "peagle"):
        path = REPO / "configs" / "train" / f"{draft}-llama-demo.yaml"
        assert load_config(RunConfig, path, sets).draft.draft_vocab_size == 64
        assert load_config(RunConfig, path, sets[:2]).draft.draft_vocab_size == 1024


def test_the_old_draft_vocabulary_keys_are_unknown_keys(tmp_path: Path) -> None:
    """The validators that said where these keys moved went (a 0.1.0 package); the keys are
    now refused like any unknown key, in one line naming file, line and key."""
    eagle3 = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"
    with pytest.raises(ConfigError, match="unknown key 'data.draft_vocab_size'"):
        load_config(RunConfig, eagle3, ["target.path=t", "data.train=d", "data.draft_vocab_size=8"])
    # prepare-data: the CLI's one line (exit 2), naming the file and line of the old key.
    old = tmp_path / "prepare.yaml"
    old.write_text(
        "inputs: [a.jsonl]\noutput_dir: out\ntokenizer: tok\nvocab:\n  draft_vocab_size: 64\n"
    )
    result = CliRunner().invoke(app, ["prepare-data", "-c", str(old)])
    assert result.exit_code == 2, result.output
    assert f"{old}:5: unknown key 'vocab.draft_vocab_size'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize("algorithm", QK_NORM)
def test_the_old_layer_style_key_is_an_unknown_key(algorithm: str, tmp_path: Path) -> None:
    """draft.layer_style (llama/qwen3/auto) is draft.qk_norm now: the old key in a user's
    file is one line naming file, line and key (exit 2, nothing written)."""
    cfg = yaml.safe_load((REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml").read_text())
    cfg["target"]["path"], cfg["data"]["train"] = "t", "d"
    cfg["train"]["output_dir"] = str(tmp_path / "out")
    cfg["draft"]["layer_style"] = "qwen3"
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(cfg, sort_keys=False))
    line = old.read_text().splitlines().index("  layer_style: qwen3") + 1
    result = CliRunner().invoke(train_draft_app, ["-c", str(old)])
    assert result.exit_code == 2, result.output
    # the CLI's config error: its heading, then one line per error
    assert result.output.startswith("error: invalid config:\n"), result.output
    errors = result.output.strip().splitlines()[1:]
    assert len(errors) == 1 and errors[0].strip().startswith(f"{old}:{line}: "), result.output
    assert f"{old}:{line}: unknown key 'draft.layer_style'" in errors[0]
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_checkpoint_written_with_layer_style_reads_as_qk_norm(tmp_path: Path) -> None:
    """Every EAGLE-3 and P-EAGLE checkpoint written before the rename holds
    draft.layer_style (dump_config writes "auto" when unset): export-draft and resume read
    it as the q/k norm switch it was."""
    assert QK_NORM, "no draft config has draft.qk_norm"
    for algorithm in QK_NORM:
        old = yaml.safe_load(
            (REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml").read_text()
        )
        old["target"]["path"], old["data"]["train"] = "t", "d"
        old["draft"].pop("qk_norm", None)
        for style, qk_norm in (("auto", None), ("llama", False), ("qwen3", True)):
            old["draft"]["layer_style"] = style
            (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
            assert stored_config(tmp_path).draft.qk_norm is qk_norm, (algorithm, style)


def test_a_checkpoint_written_with_optim_name_and_momentum_still_reads(tmp_path: Path) -> None:
    """Every checkpoint written before optim.name (adamw | adam | sgd) and optim.momentum
    went holds both with their defaults (dump_config writes every field): export-draft and
    resume read them as the AdamW they were; any other value is refused as unknown."""
    old = yaml.safe_load((REPO / "configs" / "train" / "eagle3-llama-demo.yaml").read_text())
    old["target"]["path"], old["data"]["train"] = "t", "d"
    old["optim"] |= {"name": "adamw", "momentum": 0.0, "lr": 2.5e-4}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    assert stored_config(tmp_path).optim.lr == 2.5e-4
    old["optim"]["name"] = "sgd"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match="unknown key 'optim.name'"):
        stored_config(tmp_path)


@pytest.mark.parametrize("algorithm", QK_NORM)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_qk_norm_unset_follows_the_target_and_set_overrides_it(algorithm: str, family: str) -> None:
    """The draft normalises q and k where the target's attention does (transformers' own
    modules have q_norm), or as draft.qk_norm says; vLLM then reads the matching layer."""
    shape = load_config(DemoConfig, REPO / "configs" / "demo" / "default.yaml").shape
    config = target_config(family, shape, vocab_size=2048, bos=1, eos=2, pad=0)
    torch.manual_seed(0)
    model = (LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM)(config)
    target = FrozenTarget(model)
    targets_norm = hasattr(model.model.layers[0].self_attn, "q_norm")
    assert targets_norm is (family == "qwen3")
    path = REPO / "configs" / "train" / f"{algorithm}-{family}-demo.yaml"
    sets = ["target.path=t", "data.train=d"]
    sets += ["draft.mask_token_id=3"] if has_field(algorithm, "mask_token_id") else []
    spec = get_draft(algorithm)
    for setting, expected in (("null", targets_norm), ("true", True), ("false", False)):
        draft = load_config(RunConfig, path, [*sets, f"draft.qk_norm={setting}"]).draft
        state = spec.build(draft, target, None).state_dict()
        assert ("layers.0.self_attn.q_norm.weight" in state) is expected, setting
        assert ("layers.0.self_attn.k_norm.weight" in state) is expected, setting
        exported = spec.to_vllm(state, draft, target.description).config
        assert exported["model_type"] == ("qwen3" if expected else "llama"), setting


def test_eval_acceptance_takes_config_and_set(tmp_path: Path) -> None:
    cfg = tmp_path / "eval.yaml"
    cfg.write_text("target: t\ndrafters: [d]\nmax_new_tokens: 64\n")
    result = CliRunner().invoke(app, ["eval-acceptance", "-c", str(cfg), "--set", "turns=3"])
    assert result.exit_code == 2
    assert "turns" in result.output and "Traceback" not in result.output


def test_a_checkpoint_written_before_the_move_still_reads(tmp_path: Path) -> None:
    """Older checkpoints' config.yaml holds data.draft_vocab_size (dump_config writes null
    when unset): export-draft and resume read it, the size now the draft's."""
    eagle3 = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"
    old = yaml.safe_load(eagle3.read_text())
    old["target"]["path"], old["data"]["train"] = "t", "d"
    del old["draft"]["draft_vocab_size"]
    for size in (None, 64):
        old["data"]["draft_vocab_size"] = size
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
        assert stored_config(tmp_path).draft.draft_vocab_size == size


def test_dflash_loss_auto_follows_the_training_data(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
) -> None:
    """auto: hard_ce on answers the target regenerated, forward_kl on the dataset's own answers
    (measured both ways, README); an explicit choice is kept; other drafts are untouched."""
    path = REPO / "configs" / "train" / "dflash-llama-demo.yaml"
    cfg = load_config(RunConfig, path, ["target.path=t", "data.train=d"])
    assert cfg.draft.loss == "auto"
    regenerated = {"regeneration": {"settings": {"model": "t", "temperature": 0.0}}}
    assert with_data_defaults(cfg, regenerated).draft.loss == "hard_ce"
    assert with_data_defaults(cfg, {"regeneration": None}).draft.loss == "forward_kl"
    hard = load_config(RunConfig, path, ["target.path=t", "data.train=d", "draft.loss=hard_ce"])
    assert with_data_defaults(hard, {"regeneration": None}).draft.loss == "hard_ce"
    eagle3 = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        ["target.path=t", "data.train=d"],
    )
    assert with_data_defaults(eagle3, {"regeneration": None}) == eagle3
    # train-draft on the tiny world's original (not regenerated) answers saves its choice
    out = tmp_path / "run"
    sets = run_sets(
        tiny_world,
        tiny_llama_data,
        out,
        "data.micro_batch_size=2",
        "data.max_length=64",
        "draft.num_anchors=4",
        "train.max_steps=1",
        "train.save_every=1",
        algo="dflash",
    )
    args = cli_args(sets, "dflash")
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((out / "config.yaml").read_text())["draft"]["loss"] == "forward_kl"
    saved = stored_config(out / "checkpoints" / "step-0000001")
    assert saved.draft.loss == "forward_kl"
