"""The target side of a run: which target is loaded (whole, FSDP2-sharded, or its head
alone), where each batch's features come from (online or a feature cache), and
``prepare-features``, which fills a cache from the same run config that trains from it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from eagle_train.data.loader import PreparedData
from eagle_train.drafts.registry import get_draft
from eagle_train.fsutil import (
    UnsafePathError,
    check_no_overlap,
    check_output_path,
    naming_disk_full,
)
from eagle_train.parallel import DistEnv, barrier, init_distributed, shutdown
from eagle_train.run_config import DTYPES, RunConfig
from eagle_train.target_model.cache import CacheChain, FeatureCache, FeatureCacheError, plan_shards
from eagle_train.target_model.extract import (
    ExtractSettings,
    SplitReport,
    cache_identity,
    clean_stale,
    extract_split,
    finish_split,
    open_split,
)
from eagle_train.target_model.frozen import FrozenTarget
from eagle_train.target_model.sharded import load_sharded_target
from eagle_train.target_model.source import CachedFeatures, FeatureSource, OnlineFeatures
from eagle_train.target_model.weights import load_target_head

log = logging.getLogger(__name__)


def load_target(cfg: RunConfig, env: DistEnv, device_map: str | None = None) -> FrozenTarget:
    """What this run needs of the target: its head and embeddings when the features come
    from a cache, else the whole target (FSDP2-sharded over the ranks with target.shard)."""
    dtype = DTYPES[cfg.target.dtype]
    if cfg.data.from_cache:
        return load_target_head(cfg.target.path, dtype, env.device)
    if cfg.target.shard and env.distributed:
        return load_sharded_target(cfg.target.path, dtype, env.device, env.world_size)
    return FrozenTarget.from_pretrained(cfg.target.path, dtype, device_map or str(env.device))


def feature_sources(
    cfg: RunConfig, target: FrozenTarget, layer_ids: list[int], env: DistEnv
) -> tuple[FeatureSource, FeatureSource]:
    """(training, validation) feature sources; every cache is checked against this run's
    target, layer set, dataset and dtype before any step. A mixture's sources are read from
    their own caches, chained in data.train's order (the mixture's rows end to end)."""
    if not cfg.data.from_cache:
        online = OnlineFeatures(target, layer_ids)
        return online, online

    def opened(cache_dir: Path, data: Path) -> FeatureCache:
        cache = FeatureCache(cache_dir)
        cache.check(cache_identity(cfg.target.path, cfg.target.dtype, layer_ids, data))
        return cache

    train = cfg.data.train
    if isinstance(train, list):
        chain = [opened(Path(s.features) / "train", s.path) for s in train if s.features]
        train_cache: FeatureCache | CacheChain = CacheChain(chain)
    else:
        train_cache = opened(Path(cfg.data.features or "") / "train", train)
    sources = [CachedFeatures(train_cache, target.lm_head(), layer_ids, env.device)]
    if cfg.data.val is not None:
        val_cache = opened(Path(cfg.data.features or "") / "val", cfg.data.val)
        sources.append(CachedFeatures(val_cache, target.lm_head(), layer_ids, env.device))
    return sources[0], sources[-1]


def prepare_features(cfg: RunConfig, settings: ExtractSettings) -> list[SplitReport]:
    """Run the target once over ``data.train`` (and ``data.val``) and write the layers
    ``draft`` reads to ``data.features``/{train,val}. Under torchrun the ranks (of every
    node) split the shards; run again after a crash to finish."""
    if cfg.data.features is None:
        raise FeatureCacheError("data.features: expected the directory to write the cache to")
    if isinstance(cfg.data.train, list):
        raise FeatureCacheError(
            "data.train: prepare-features writes one dataset's cache: run it once per source "
            "(--set data.train=PATH --set data.features=DIR), then name DIR as that source's "
            "features"
        )
    splits = [("train", cfg.data.train_dir)] + ([("val", cfg.data.val)] if cfg.data.val else [])
    check_cache_apart(cfg, Path(cfg.data.features))
    for _, data in splits:  # every dataset readable before anything is written
        PreparedData(Path(data))
    env = init_distributed(cfg.train.device, cfg.train.dist_timeout_s)
    try:
        target = FrozenTarget.from_pretrained(
            cfg.target.path, DTYPES[cfg.target.dtype], settings.device_map or str(env.device)
        )
        layer_ids = get_draft(cfg.draft.algorithm).target_layer_ids(cfg.draft, target.description)
        target.check_layer_ids(layer_ids)
        reports = []
        for split, data in splits:
            with naming_disk_full(Path(cfg.data.features) / split, "the feature cache"):
                report = _prepare_split(cfg, target, layer_ids, split, Path(data), settings, env)
            reports.append(report)
        return reports
    finally:
        shutdown(env)


def check_cache_apart(cfg: RunConfig, features: Path) -> None:
    """``data.features`` is a directory of its own: not a file, and not one of the run's
    inputs, inside one or holding one (a cache written into a dataset would be lost when the
    dataset is prepared again, and one inside the target would change the target's folder)."""
    if features.is_symlink() and not features.exists():
        raise FeatureCacheError(f"data.features {features} is a broken link")
    if features.exists() and not features.is_dir():
        raise FeatureCacheError(
            f"data.features {features} is a file: expected the directory to write the cache to"
        )
    inputs = [("dataset", Path(cfg.data.train_dir)), ("target", cfg.target.path)]
    if cfg.data.val is not None:
        inputs.append(("validation dataset", Path(cfg.data.val)))
    try:
        check_output_path(features, "data.features")
        check_no_overlap(features, "data.features", inputs)
    except UnsafePathError as exc:
        raise FeatureCacheError(str(exc)) from None


def _prepare_split(
    cfg: RunConfig,
    target: FrozenTarget,
    layer_ids: list[int],
    split: str,
    data_path: Path,
    settings: ExtractSettings,
    env: DistEnv,
) -> SplitReport:
    t0 = time.perf_counter()
    out = Path(cfg.data.features) / split
    rows = PreparedData(data_path).rows["input_ids"]
    identity = cache_identity(cfg.target.path, cfg.target.dtype, layer_ids, data_path)
    width = (len(set(layer_ids)) + 1) * target.config.hidden_size * target.dtype.itemsize
    per_shard = max(1, int(settings.shard_mib * 2**20) // width)  # tokens
    identity["shards"] = plan_shards([len(r) for r in rows], per_shard)
    if env.is_main:  # creates the split (or checks the one there), then the others check
        open_split(out, identity, True)
        clean_stale(out)
    barrier(env)
    if not env.is_main:
        open_split(out, identity, False)
    device = target.model.device if settings.device_map else env.device
    written = extract_split(target, rows, out, identity, settings, device, env.rank, env.world_size)
    barrier(env)
    if env.is_main:
        manifest = finish_split(out, identity)
        log.info(
            "%s: %d rows, %d tokens, %.1f MiB in %d shards",
            out, manifest["rows"], manifest["tokens"], manifest["bytes"] / 2**20,
            len(manifest["files"]),
        )  # fmt: skip
    barrier(env)
    return SplitReport(
        path=out,
        rows=len(rows),
        tokens=sum(len(r) for r in rows),
        shards=len(identity["shards"]),
        written=written,
        seconds=time.perf_counter() - t0,
    )
