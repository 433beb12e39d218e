"""Data mixed by weight (``data.train: [{path, weight}, ...]``): each epoch draws every
source's share of rows, deterministically from the seed, resumably, and the run reports
each source's share of the supervised tokens. The expected counts are worked out here by
hand from the dataset sizes, not by the mixture's own helpers."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import run_configs
import torch
from conftest import draft_vocab_sets, prepare_tiny_data
from run_configs import target_path
from typer.testing import CliRunner

from eagle_train.cli import train_draft_app
from eagle_train.config import ConfigError
from eagle_train.data.loader import BatchLoader, LoaderState, PreparedData
from eagle_train.data.mixture import MixedData
from eagle_train.data.store import PreparedDataError
from eagle_train.metrics import read_metrics
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "train" / "eagle3-llama-demo.yaml"


@pytest.fixture(scope="module")
def small(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, smaller source: the tiny world's validation chats."""
    out = tmp_path_factory.mktemp("mix") / "llama-val"
    return prepare_tiny_data(tiny_world, "llama", "val", out, regenerate=False)


def sources_of(rows: list[int], size_a: int) -> Counter[str]:
    return Counter("a" if r < size_a else "b" for r in rows)


def test_each_epoch_draws_every_source_by_weight(tiny_llama_data: Path, small: Path):
    a, b = len(PreparedData(tiny_llama_data)), len(PreparedData(small))
    assert a > 3 * b  # so the small source's share (1/4 of the rows) repeats it
    mixed = MixedData([(tiny_llama_data, 3.0), (small, 1.0)])
    loader = BatchLoader(mixed, 4, seed=0, pad_id=0)
    order = mixed.epoch_order(torch.Generator().manual_seed(0))
    total = a + b
    assert sources_of(order, a) == {"a": round(total * 3 / 4), "b": round(total / 4)}
    # the small source is repeated in whole passes: every row of it equally often (+-1)
    reps = Counter(r for r in order if r >= a)
    assert set(reps) == set(range(a, a + b))
    assert max(reps.values()) - min(reps.values()) <= 1
    # the large one is subsampled without repeats
    assert max(Counter(r for r in order if r < a).values()) == 1
    # the loader's epochs are whole steps of that stream, and the meter names the source
    batch = loader.next()
    sums = loader.meter.take()
    per_source = sums[4:].tolist()
    expected = [0.0, 0.0]
    for row, mask in zip(batch.rows.tolist(), batch.loss_mask, strict=True):
        expected[0 if row < a else 1] += float(mask.sum())
    assert per_source == expected


def test_the_stream_is_seeded_differs_by_epoch_and_resumes(tiny_llama_data: Path, small: Path):
    def stream(loader: BatchLoader, n: int) -> list[list[int]]:
        return [loader.next().rows.tolist() for _ in range(n)]

    def loader() -> BatchLoader:
        return BatchLoader(MixedData([(tiny_llama_data, 3.0), (small, 1.0)]), 4, 0, 0)

    first = loader()
    per_epoch = first.batches_per_epoch
    whole = stream(first, 2 * per_epoch + 3)
    assert whole == stream(loader(), 2 * per_epoch + 3)  # the same seed, the same stream
    assert whole[:per_epoch] != whole[per_epoch : 2 * per_epoch]  # a fresh order each epoch
    resumed = loader()  # a checkpoint's loader position, just before an epoch boundary
    resumed.state = LoaderState(epoch=0, offset=per_epoch - 1)
    assert stream(resumed, 4) == whole[per_epoch - 1 : per_epoch + 3]


def run_config(world: Path, train: str, out: Path, *extra: str) -> RunConfig:
    return run_configs.run_config(world, train, out, "data.max_length=128", *extra)


def test_train_draft_reports_each_sources_share(
    tiny_world: Path, tiny_llama_data: Path, small: Path, tmp_path: Path
):
    out = tmp_path / "run"
    train = f"[{{path: {tiny_llama_data}, weight: 3}}, {{path: {small}, weight: 1}}]"
    args = ["--config", str(CONFIG)]
    for o in [
        f"target.path={target_path(tiny_world)}",
        f"data.train={train}",
        "data.val=null",
        "data.max_length=128",
        f"train.output_dir={out}",
        "train.max_steps=4",
        "train.log_every=2",
        "train.save_every=4",
        "train.progress=false",
        *draft_vocab_sets("eagle3"),
    ]:
        args += ["--set", o]
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 0, result.output
    rows = read_metrics(out / "metrics.jsonl", "train")
    shares = [(r[f"share_{tiny_llama_data.name}"], r[f"share_{small.name}"]) for r in rows]
    assert all(abs(x + y - 1.0) < 1e-6 and x > 0 and y > 0 for x, y in shares)
    saved = (out / "config.yaml").read_text()  # the run records its mixture
    assert str(small) in saved and "weight: 1.0" in saved


def test_mixture_refusals(tiny_world: Path, tiny_llama_data: Path, small: Path, tmp_path: Path):
    one = f"{{path: {small}, weight: 1}}"
    with pytest.raises(ConfigError, match="data.features: a feature cache holds one"):
        run_config(tiny_world, f"[{one}]", tmp_path / "r", f"data.features={tmp_path}")
    with pytest.raises(ConfigError, match="listed twice"):
        run_config(tiny_world, f"[{one}, {one}]", tmp_path / "r")
    with pytest.raises(ConfigError, match="weight"):
        run_config(tiny_world, f"[{{path: {small}, weight: 0}}]", tmp_path / "r")
    other = tmp_path / "other-vocab"
    shutil.copytree(small, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["token_counts"]["target_vocab_size"] = 1024
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PreparedDataError, match="different vocabularies"):
        MixedData([(tiny_llama_data, 1.0), (other, 1.0)])
