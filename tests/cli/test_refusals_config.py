"""Issue 59: settings and flags that printed a traceback, ran forever or were silently
wrong are one line naming the key (or flag) and what was expected, exit 2, no traceback,
nothing written. Table-driven, through the real command line in-process (typer's CliRunner),
before any model is loaded."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from cli_runs import CONFIG, cli_args, run_sets
from refusal_checks import invoke, one_line_error
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train.cli import (
    build_demo_app,
    eval_acceptance_app,
    prepare_features_app,
    train_draft_app,
)
from eagle_train.config import ConfigError, load_config
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "demo" / "tiny.yaml"
# "Billion laughs": each level names the one above nine times (9**9 values, 442 bytes).
BOMB_LEVELS = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
]


@pytest.fixture
def bomb(tmp_path: Path) -> Path:
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(BOMB_LEVELS) + "\n")
    return path


def test_a_yaml_alias_bomb_is_refused(bomb: Path, tmp_path: Path):
    """Before: a 442-byte config (as -c or in --set) never finished loading."""
    out = tmp_path / "world"
    one_line_error(
        invoke(build_demo_app, [out, "-c", bomb]), f"{bomb}: not valid YAML: its aliases expand"
    )
    inline = "{" + ", ".join(BOMB_LEVELS) + "}"
    result = invoke(build_demo_app, [out, "--set", f"seed={inline}"])
    one_line_error(result, "value is not valid YAML: its aliases expand to more than")
    recursive = tmp_path / "loop.yaml"
    recursive.write_text("a: &a [*a]\n")
    one_line_error(invoke(build_demo_app, [out, "-c", recursive]), f"{recursive}")
    assert not out.exists()


@pytest.mark.parametrize(
    "setting, named",
    [
        ("vocab_size=-1", "vocab_size"),
        ("shape.num_attention_heads=3", "num_attention_heads 3 does not divide hidden_size 64"),
        ("shape.num_key_value_heads=3", "num_key_value_heads 3 does not divide"),
        ("seed=1e20", "seed"),
        ("pretrain.seq_len=0", "pretrain.seq_len"),
    ],
)
def test_build_demo_world_settings(setting: str, named: str, tmp_path: Path):
    """Before: vocab_size=-1 and num_attention_heads=3 were tracebacks from the tokenizer
    trainer and the model constructor."""
    out = tmp_path / "world"
    one_line_error(invoke(build_demo_app, [out, "-c", TINY, "--set", setting]), named)
    assert not out.exists()


@pytest.mark.parametrize(
    "setting, named",
    [
        ("train.seed=1e20", "train.seed"),
        ("data.seed=-1", "data.seed"),
        ("train.device=banana", "train.device"),
        ("draft.ttt_steps=100000", "draft.ttt_steps"),
        ("draft.num_layers=1000", "draft.num_layers"),
        ("data.max_length=1000000000000", "data.max_length"),
    ],
)
def test_train_draft_settings_refused_when_read(setting: str, named: str, tmp_path: Path):
    """Before: train.seed=1e20 and train.device=banana were tracebacks from torch after the
    run had started; draft.ttt_steps=100000 grew memory without end."""
    sets = run_sets(tmp_path / "target", tmp_path / "data", tmp_path / "run", setting)
    one_line_error(invoke(train_draft_app, cli_args(sets)), named)
    assert not (tmp_path / "run").exists()


def test_a_mixture_naming_one_dataset_twice_through_a_symlink(tmp_path: Path):
    """Before: accepted, doubling the dataset's weight."""
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "again").symlink_to(data)
    mixture = f"data.train=[{{path: {data}, weight: 1}}, {{path: {tmp_path / 'again'}, weight: 1}}]"
    sets = run_sets(tmp_path / "target", data, tmp_path / "run", mixture)
    result = invoke(train_draft_app, cli_args(sets))
    one_line_error(result, f"a source is listed twice (as {data} and {tmp_path / 'again'})")


def test_mixture_weights_whose_sum_overflows(tmp_path: Path):
    """Before: weights 1e308 + 1e308 summed to inf and the sampler raised."""
    a, b = tmp_path / "a", tmp_path / "b"
    mixture = f"data.train=[{{path: {a}, weight: 1e308}}, {{path: {b}, weight: 1e308}}]"
    sets = run_sets(tmp_path / "target", a, tmp_path / "run", mixture)
    one_line_error(invoke(train_draft_app, cli_args(sets)), "the weights' sum is not a finite")


def test_one_drafter_named_twice(tmp_path: Path):
    """Before: --draft D --draft D measured D twice and pooled both into one entry."""
    d = tmp_path / "d"
    d.mkdir()
    (tmp_path / "link").symlink_to(d)
    for second in (d, tmp_path / "link"):
        args = ["--target", tmp_path, "--draft", d, "--draft", second, "--out", tmp_path / "e"]
        one_line_error(invoke(eval_acceptance_app, args), f"drafter {second} is named twice")
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(
    "flag, value, named",
    [
        ("--shard-mib", "inf", "--shard-mib inf"),
        ("--device-map", "banana", "--device-map 'banana': expected one of auto"),
    ],
)
def test_prepare_features_flags(flag: str, value: str, named: str, tmp_path: Path):
    sets = run_sets(
        tmp_path / "t", tmp_path / "d", tmp_path / "run", f"data.features={tmp_path / 'c'}"
    )
    one_line_error(invoke(prepare_features_app, cli_args(sets, flag, value)), named)
    assert not (tmp_path / "c").exists()
    # nan fails typer's own range check: its usage error, exit 2, no traceback
    result = invoke(prepare_features_app, cli_args(sets, "--shard-mib", "nan"))
    assert result.exit_code == 2 and "'--shard-mib'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no GPU")
def test_train_device_cuda_without_a_gpu(tiny_world: Path, tiny_llama_data: Path, tmp_path: Path):
    """Before: torch's "Torch not compiled with CUDA enabled" traceback."""
    target = target_path(tiny_world)
    run = tmp_path / "run"
    sets = run_sets(target, tiny_llama_data, run, "train.device=cuda")
    one_line_error(
        invoke(train_draft_app, cli_args(sets)), "train.device cuda: this process sees 0 CUDA"
    )
    assert not run.exists()


def test_config_used_by_name(tmp_path: Path):
    """The train config the table uses is the project's own (its keys are the ones users set)."""
    assert CONFIG.is_file()


@pytest.mark.parametrize("value", ["inf", ".inf", "nan", "-.inf"])
def test_inf_and_nan_are_refused_in_any_number(value: str, tmp_path: Path):
    """Before: optim.lr=inf passed validation and the first step made every weight NaN."""
    sets = run_sets("t", "d", tmp_path, f"optim.lr={value}")
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(RunConfig, CONFIG, sets)


@pytest.mark.parametrize("value", ["yes", "true", "no"])
def test_resume_yes_says_to_write_auto(value: str, tmp_path: Path):
    """Before: --resume yes said "Input should be a valid string (got True)"."""
    with pytest.raises(ConfigError, match="train.resume.*write auto"):
        load_config(RunConfig, CONFIG, run_sets("t", "d", tmp_path, f"train.resume={value}"))


def test_resume_past_max_steps_is_refused_and_at_max_steps_says_so(
    tiny_world: Path, tiny_llama_data: Path, tmp_path: Path, caplog
):
    """Before: --resume auto with max_steps below the checkpoint's step exited 0 silently."""
    out = tmp_path / "run"
    target = target_path(tiny_world)
    runner = CliRunner()
    first = runner.invoke(train_draft_app, cli_args(run_sets(target, tiny_llama_data, out)))
    assert first.exit_code == 0, first.output
    metrics = (out / "metrics.jsonl").read_bytes()
    below = run_sets(target, tiny_llama_data, out, "train.max_steps=2")
    result = runner.invoke(train_draft_app, cli_args(below, "--resume", "auto"))
    assert result.exit_code == 2
    assert "step 4, past train.max_steps 2" in result.output
    assert (out / "metrics.jsonl").read_bytes() == metrics
    with caplog.at_level(logging.WARNING):
        same = runner.invoke(
            train_draft_app, cli_args(run_sets(target, tiny_llama_data, out), "--resume", "auto")
        )
    assert same.exit_code == 0, same.output
    assert "nothing left to train" in caplog.text
