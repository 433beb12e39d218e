"""Issue 59, targets, drafters and caches: folders that printed a traceback are one line
naming the folder or file and what was expected, exit 2, nothing written. Through the real
command line in-process (typer's CliRunner)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_runs import cli_args, run_sets
from refusal_checks import invoke, one_line_error
from run_configs import target_path
from safetensors.torch import load_file

from eagle_train.cli import eval_acceptance_app, export_draft_app, train_draft_app


def target_copy(world: Path, tmp_path: Path, name: str = "target") -> Path:
    out = tmp_path / name
    shutil.copytree(target_path(world), out)
    return out


def test_a_target_with_pickled_weights_only(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path
):
    """Before: transformers' traceback (and a pickle it would have to unpickle)."""
    target = target_copy(tiny_world, tmp_path)
    weights = target / "model.safetensors"
    torch.save(load_file(str(weights)), target / "pytorch_model.bin")
    weights.unlink()
    run = tmp_path / "run"
    result = invoke(train_draft_app, cli_args(run_sets(target, tiny_llama_data, run)))
    one_line_error(result, f"target.path '{target}': holds only pytorch_model.bin (pickled")
    assert not run.exists()


def test_an_evaluated_target_without_a_tokenizer(tiny_world: Path, tmp_path: Path, no_vllm: None):  # noqa: F811
    """Before: a traceback from AutoTokenizer."""
    target = target_copy(tiny_world, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (target / name).unlink(missing_ok=True)
    out = tmp_path / "eval"
    args = ["--target", target, "--draft", "ngram", "--out", out, "--set", "num_prompts=1"]
    one_line_error(
        invoke(eval_acceptance_app, args), f"--target '{target}': AutoTokenizer cannot load"
    )
    assert not out.exists()


@pytest.mark.parametrize("damage", ["truncated", "pickle"])
def test_a_broken_warm_start_drafter(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, damage: str
):
    """Before: safetensors' traceback for a cut export; torch's UnpicklingError for a
    pytorch_model.bin holding code (never executed)."""
    from exported_drafts import export_random

    drafter = export_random(tiny_world, "llama", tmp_path / "drafter")
    weights = drafter / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        named = "model.safetensors: not a readable safetensors file"
    else:

        class Payload:
            def __reduce__(self):
                return (print, ("pwned",))

        torch.save({"x": Payload()}, drafter / "pytorch_model.bin")
        weights.unlink()
        named = "pytorch_model.bin: not a plain tensor file (refused unpickling"
    run = tmp_path / "run"
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, run, f"draft.init_from={drafter}")
    result = invoke(train_draft_app, cli_args(sets))
    one_line_error(result, f"draft.init_from {drafter}: {named}")
    assert "pwned" not in result.output and not run.exists()


@pytest.mark.parametrize(
    "manifest, named",
    [
        ('{"format_version": 1, "fil', "manifest.json: unreadable"),
        ('{"format_version": 1, "shards": [[0, 4]]}', "manifest.json: expected 'files'"),
        ("[1, 2]", "manifest.json: expected a JSON object"),
    ],
)
def test_a_damaged_feature_cache_manifest(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, manifest: str, named: str
):
    """Before: a JSONDecodeError or KeyError traceback."""
    cache = tmp_path / "cache"
    (cache / "train").mkdir(parents=True)
    (cache / "train" / "identity.json").write_text(json.dumps({"format_version": 1}))
    (cache / "train" / "manifest.json").write_text(manifest)
    run = tmp_path / "run"
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, run, f"data.features={cache}")
    one_line_error(invoke(train_draft_app, cli_args(sets)), named)
    assert not run.exists()


@pytest.mark.slow  # trains a two-step run
def test_export_refuses_a_checkpoint_whose_config_disagrees_with_its_tensors(
    trained: Path,  # noqa: F811
    tmp_path: Path,
):
    """Before: a checkpoint whose config.yaml says draft_vocab_size 128 while its tensors
    hold 256 rows was exported with contradictory provenance."""
    from cli_runs import refingerprint

    ckpt = tmp_path / "step-0000002"
    shutil.copytree(trained, ckpt)
    config = ckpt / "config.yaml"
    text = config.read_text()
    size = int(text.split("draft_vocab_size: ")[1].split()[0])
    config.write_text(text.replace(f"draft_vocab_size: {size}", f"draft_vocab_size: {size // 2}"))
    refingerprint(ckpt, "config.yaml")
    out = tmp_path / "drafter"
    result = invoke(export_draft_app, [ckpt, out])
    one_line_error(
        result,
        f"its config sets draft.draft_vocab_size {size // 2}, but its tensors hold a draft "
        f"vocabulary of {size}",
    )
    assert not out.exists()


@pytest.mark.slow  # trains a two-step run
def test_resuming_a_checkpoint_with_another_target(
    trained: Path,  # noqa: F811
    tiny_world: Path,
    tiny_llama_data: Path,
    tmp_path: Path,
):
    """Before: a Llama run resumed with the Qwen3 target (same vocabulary and hidden size)
    was torch's "Missing optimizer state" traceback."""
    qwen = target_path(tiny_world, "qwen3")
    run = tmp_path / "run"
    sets = run_sets(qwen, tiny_llama_data, run, "train.max_steps=3")
    result = invoke(train_draft_app, cli_args(sets, "--resume", str(trained)))
    one_line_error(result, f"{trained}: does not fit this run's draft (saved for target")
    assert f"this run: target {qwen}" in result.output
