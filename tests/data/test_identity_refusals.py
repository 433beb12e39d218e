"""Identity checks both ways, each with a strict subset, a strict superset and a disjoint set
of layers, and the outcome each must have:

- a run reading a feature cache (``mismatches``): the cache may hold MORE layers than the run
  reads (by design: rows are read by tensor name, ``hidden.K``), never fewer or others;
- prepare-features resuming into a directory: exactly the same layer set, nothing else;
- a warm-start drafter against the run's draft: exactly the run's aux layers (vLLM feeds the
  drafter the layers its config names);
- resuming a checkpoint: exactly the checkpoint's draft section (its aux layers included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO
from run_configs import target_path

from eagle_train.config import ConfigError, load_config
from eagle_train.drafts.registry import get_draft
from eagle_train.drafts.warm_start import warm_start
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget
from eagle_train.target_model.cache import FeatureCacheError, mismatches
from eagle_train.target_model.extract import open_split

RUN = [1, 2, 3]
SETS = {"equal": [1, 2, 3], "subset": [1, 2], "superset": [0, 1, 2, 3], "disjoint": [0, 4]}


def identity(layer_ids: list[int]) -> dict:
    return {
        "format": "eagle-train-features",
        "format_version": 1,
        "target": {"path": "/t", "config_sha256": "c" * 64, "weights_fingerprint": "w" * 64},
        "layer_ids": layer_ids,
        "dataset": "d" * 64,
        "dataset_path": "/d",
        "dtype": "bfloat16",
        "shards": [[0, 8]],
    }


@pytest.mark.parametrize(
    "held, accepted", [("equal", True), ("subset", False), ("superset", True), ("disjoint", False)]
)
def test_a_run_reads_a_cache_holding_at_least_its_layers(held: str, accepted: bool) -> None:
    problems = mismatches(identity(RUN), identity(SETS[held]))
    if accepted:
        assert problems == []
    else:
        missing = sorted(set(RUN) - set(SETS[held]))
        assert len(problems) == 1 and f"missing {missing}" in problems[0]


def test_a_cache_for_another_target_dataset_or_dtype_is_refused() -> None:
    for key, value in [("dataset", "e" * 64), ("dtype", "float32")]:
        assert len(mismatches(identity(RUN), {**identity(RUN), key: value})) == 1
    other = identity(RUN)
    other["target"] = {**other["target"], "weights_fingerprint": "x" * 64}
    assert len(mismatches(identity(RUN), other)) == 1


@pytest.mark.parametrize("held", sorted(SETS))
def test_prepare_features_resumes_only_into_the_same_layer_set(held: str, tmp_path: Path) -> None:
    out = tmp_path / "features"
    open_split(out, identity(SETS[held]), is_main=True)  # an earlier prepare-features
    if held == "equal":
        open_split(out, identity(RUN), is_main=True)
        return
    with pytest.raises(FeatureCacheError, match="made for something else"):
        open_split(out, identity(RUN), is_main=True)


def test_prepare_features_does_not_resume_into_an_older_format(tmp_path: Path) -> None:
    out = tmp_path / "features"
    open_split(out, {**identity(RUN), "format_version": 1}, is_main=True)  # no greedy tokens
    with pytest.raises(FeatureCacheError, match="format 1"):
        open_split(out, {**identity(RUN), "format_version": 2}, is_main=True)


FIXTURE = REPO / "tests" / "assets" / "speculators" / "eagle3-llama-tiny"  # aux [1, 2, 3]


@pytest.mark.parametrize("held", sorted(SETS))
def test_a_warm_start_drafter_must_read_exactly_the_runs_layers(
    held: str, wide_world: Path
) -> None:
    target = FrozenTarget.from_pretrained(target_path(wide_world, "llama", "fp32"), torch.float32)
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / "eagle3-llama-demo.yaml",
        [
            f"target.path={target.model.name_or_path}",
            "target.dtype=float32",
            "data.train=unused",
            f"draft.init_from={FIXTURE}",
            f"draft.aux_layer_ids={SETS[held]}".replace(" ", ""),
        ],
    ).draft
    spec = get_draft("eagle3")
    draft = spec.build(cfg, target, None)
    if held == "equal":
        warm_start(cfg, spec, draft, target.description)
        return
    with pytest.raises(ConfigError, match="eagle_aux_hidden_state_layer_ids is \\[1, 2, 3\\]"):
        warm_start(cfg, spec, draft, target.description)


def test_resume_refuses_a_checkpoint_of_another_layer_set(tiny_world: Path, tmp_path: Path) -> None:
    """Resume needs the checkpoint's draft section exactly: a subset, a superset and a
    disjoint aux layer set are each refused before a step runs."""
    from resume_runs import config, repeated_rows_data

    import eagle_train.train as loop
    from eagle_train.checkpoint import CheckpointError

    data = repeated_rows_data(tiny_world, tmp_path / "same")
    out = tmp_path / "run"
    fast = ["optim.implementation=fused", "train.max_steps=2", "train.save_every=2"]
    layers = f"draft.aux_layer_ids={RUN}".replace(" ", "")
    loop.train(config(tiny_world, data, out, "eagle3", *fast, layers))
    for held in ("subset", "superset", "disjoint"):
        other = f"draft.aux_layer_ids={SETS[held]}".replace(" ", "")
        resume = [*fast, "train.max_steps=4", "train.resume=auto", other]
        with pytest.raises(CheckpointError, match="draft section differs"):
            loop.train(config(tiny_world, data, out, "eagle3", *resume))
    same = [*fast, "train.max_steps=4", "train.resume=auto", layers]
    resumed = loop.train(config(tiny_world, data, out, "eagle3", *same))
    assert resumed.last_checkpoint.name == "step-0000004"
