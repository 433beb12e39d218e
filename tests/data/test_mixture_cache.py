"""A data.train mixture read from feature caches (each source names its prepare-features
directory): the same rows per step as the online mixture of the same seed, the features of
each row the target's own (so a row read from the wrong source's cache or offset is caught),
the same first loss, a bitwise resume across an epoch boundary, and a cache made for another
dataset refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import REPO, prepare_tiny_data
from run_configs import run_sets
from safetensors.torch import load_file
from typer.testing import CliRunner

import eagle_train.train as loop
from eagle_train.cli import prepare_features_app, train_draft_app
from eagle_train.config import ConfigError, load_config
from eagle_train.data.loader import PreparedData
from eagle_train.features import prepare_features
from eagle_train.metrics import read_metrics
from eagle_train.run_config import RunConfig
from eagle_train.target_model.cache import FeatureCacheError
from eagle_train.target_model.extract import ExtractSettings
from eagle_train.train_setup import open_run


class Stop(Exception):
    pass


def sets(world: Path, train: str, out: Path, *extra: str, algo: str = "eagle3") -> list[str]:
    return run_sets(
        world,
        train,
        out,
        "data.micro_batch_size=8",
        "data.max_length=64",
        "train.max_steps=4",
        "train.log_every=1",
        "train.save_every=4",
        "optim.warmup_steps=2",
        *extra,
        algo=algo,
    )


def demo(algo: str) -> Path:
    return REPO / "configs" / "train" / f"{algo}-llama-demo.yaml"


def config(world: Path, train: str, out: Path, *extra: str, algo: str = "eagle3") -> RunConfig:
    return load_config(RunConfig, demo(algo), sets(world, train, out, *extra, algo=algo))


def cli_args(world: Path, train: str, out: Path, *extra: str) -> list[str]:
    return ["-c", str(demo("eagle3"))] + [
        x for s in sets(world, train, out, *extra) for x in ("--set", s)
    ]


@pytest.fixture(scope="module")
def sources(wide_world: Path, tmp_path_factory) -> dict[str, Path]:
    """Two prepared datasets (37 of the wide world's train chats and 17 of its val chats:
    every step of EAGLE-1, which the resume test trains, runs the target's whole 33,024-row
    head) and a feature cache for each, made by prepare-features as a user runs it, once per
    dataset; the first cache holds a val/ split made for the second dataset too."""
    root = tmp_path_factory.mktemp("mixcache")
    big = prepare_tiny_data(wide_world, "llama", "train", root / "llama-train", False, num_chats=37)
    small = prepare_tiny_data(wide_world, "llama", "val", root / "llama-val", False, num_chats=17)
    made = {"a": big, "b": small}
    for name, data, val in (("a", big, small), ("b", small, None)):
        extra = [f"data.features={root / f'feat-{name}'}", f"data.val={val or 'null'}"]
        args = cli_args(wide_world, str(data), root / "unused", *extra)
        result = CliRunner().invoke(prepare_features_app, args)
        assert result.exit_code == 0, result.output
        made[f"feat-{name}"] = root / f"feat-{name}"
    return made


def mixture(s: dict[str, Path], cached: bool, b_features: str = "feat-b") -> str:
    fa = f", features: {s['feat-a']}" if cached else ""
    fb = f", features: {s[b_features]}" if cached else ""
    return f"[{{path: {s['a']}, weight: 1{fa}}}, {{path: {s['b']}, weight: 2{fb}}}]"


def stream(cfg: RunConfig, n: int):
    """The first ``n`` micro-batches the run's loader hands out, the run's features of each
    and the loss on the first (before any step)."""
    with open_run(cfg) as run:
        c = run.c
        batches = [run.loader.next() for _ in range(n)]
        per_epoch = run.loader.batches_per_epoch
        with torch.no_grad():
            feats = [c.features.for_batch(b) for b in batches]
            first = c.spec.compute_loss(c.draft, feats[0], batches[0], run.cfg.draft).loss
    return batches, feats, float(first), per_epoch


def test_cached_mixture_hands_out_the_online_rows_with_the_targets_features(
    wide_world: Path, sources: dict[str, Path], tmp_path: Path
):
    size_a = len(PreparedData(sources["a"]))
    online_cfg = config(wide_world, mixture(sources, False), tmp_path / "online")
    cached_cfg = config(wide_world, mixture(sources, True), tmp_path / "cached")
    _, _, _, per_epoch = stream(online_cfg, 1)
    n = per_epoch + 2  # across the first epoch boundary
    online, want, loss_online, _ = stream(online_cfg, n)
    cached, got, loss_cached, _ = stream(cached_cfg, n)
    seen = set()
    for a, b, fa, fb in zip(online, cached, want, got, strict=True):
        assert a.rows.tolist() == b.rows.tolist()
        assert torch.equal(a.input_ids, b.input_ids)
        real = a.attention_mask.bool()
        for name in ("aux", "final"):  # the online features are the whole target's forward
            x, y = getattr(fa, name)[real].float(), getattr(fb, name)[real].float()
            torch.testing.assert_close(y, x, atol=0.02, rtol=0.02)
        seen |= {r >= size_a for r in a.rows.tolist()}
    assert seen == {False, True}  # both sources (and so both caches) were read
    assert loss_cached == pytest.approx(loss_online, rel=2e-3)

    # train-draft from the caches: each step's share of supervised tokens, by hand from rows
    out = tmp_path / "cli"
    args = cli_args(wide_world, mixture(sources, True), out, "train.max_steps=2")
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 0, result.output
    steps = read_metrics(out / "metrics.jsonl", "train")
    for metrics, batch in zip(steps, cached, strict=False):
        tokens = batch.loss_mask.sum(1).double()
        from_b = float(tokens[batch.rows >= size_a].sum() / tokens.sum())
        assert metrics[f"share_{sources['b'].name}"] == pytest.approx(from_b, abs=1e-9)
    assert len(steps) == 2


def final_draft(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / f"step-{step:07d}" / "draft.safetensors"))


def test_resume_across_an_epoch_boundary_is_bitwise(
    wide_world: Path, sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # EAGLE-1 draws input noise every step: the RNG state must come back too
    def cfg(out: Path, *extra: str) -> RunConfig:
        return config(wide_world, mixture(sources, True), out, *extra, algo="eagle1")

    _, _, _, per_epoch = stream(cfg(tmp_path / "probe"), 1)
    assert per_epoch >= 3
    cut_at, last = per_epoch - 1, per_epoch + 2  # stop in epoch 0, end in epoch 1
    steps = [f"train.max_steps={last}", f"train.save_every={cut_at}"]
    whole = tmp_path / "whole"
    loop.train(cfg(whole, *steps))
    real_save = loop._save

    def save_then_stop(run, root, keep_last):
        real_save(run, root, keep_last)
        if run.state.step == cut_at:
            raise Stop  # as if preempted right after the checkpoint

    cut = tmp_path / "cut"
    monkeypatch.setattr(loop, "_save", save_then_stop)
    with pytest.raises(Stop):
        loop.train(cfg(cut, *steps))
    monkeypatch.setattr(loop, "_save", real_save)
    loop.train(cfg(cut, *steps, "train.resume=auto"))
    a, b = final_draft(whole, last), final_draft(cut, last)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    want = {m["step"]: m["loss"] for m in read_metrics(whole / "metrics.jsonl", "train")}
    got = {m["step"]: m["loss"] for m in read_metrics(cut / "metrics.jsonl", "train")}
    assert all(got[s] == want[s] for s in range(cut_at + 1, last + 1))


def test_a_source_with_another_datasets_cache_is_refused_in_one_line(
    wide_world: Path, sources: dict[str, Path], tmp_path: Path
):
    out = tmp_path / "wrong"
    args = cli_args(wide_world, mixture(sources, True, b_features="feat-a"), out)
    result = CliRunner().invoke(train_draft_app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "dataset" in lines[0] and "made for something else" in lines[0]
    assert str(sources["feat-a"]) in lines[0]
    assert not out.exists() or not any(out.iterdir())  # nothing left behind


def test_validation_from_the_cache_named_by_data_features(
    wide_world: Path, sources: dict[str, Path], tmp_path: Path
):
    val = [f"data.val={sources['b']}", "train.val_every=2", "train.val_batches=1"]
    losses = {}
    for mode, extra in (("online", []), ("cached", [f"data.features={sources['feat-a']}"])):
        out = tmp_path / mode
        train = mixture(sources, mode == "cached")
        args = cli_args(wide_world, train, out, "train.max_steps=2", *val, *extra)
        result = CliRunner().invoke(train_draft_app, args)
        assert result.exit_code == 0, result.output
        losses[mode] = [m["loss"] for m in read_metrics(out / "metrics.jsonl", "val")]
    assert len(losses["online"]) == 1
    assert losses["cached"][0] == pytest.approx(losses["online"][0], rel=2e-3)


def test_mixture_cache_settings_are_refused_where_they_do_not_apply(
    wide_world: Path, sources: dict[str, Path], tmp_path: Path
):
    s, out = sources, tmp_path / "r"
    half = (
        f"[{{path: {s['a']}, weight: 1, features: {s['feat-a']}}}, {{path: {s['b']}, weight: 1}}]"
    )
    cases = [
        (half, [], "features is set on some sources but not on"),
        (mixture(s, False), [f"data.features={s['feat-a']}"], "names each source's cache"),
        (mixture(s, True), [f"data.val={s['b']}"], "validates from one too"),
        (mixture(s, True), [f"data.features={s['feat-a']}"], "data.val is unset"),
    ]
    for train, extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            config(wide_world, train, out, *extra)
    valid = [f"data.val={s['b']}", f"data.features={tmp_path / 'f'}"]
    cfg = config(wide_world, mixture(s, True), out, *valid)
    with pytest.raises(FeatureCacheError, match="once per source"):
        prepare_features(cfg, ExtractSettings())
