"""prepare-features: run the frozen target once over a prepared dataset and store, per token,
what the draft reads (its layer set, and the final hidden state from which the trainer's
frozen head recomputes the target's logits) and the target's greedy next token (so that a
draft with its own vocabulary never needs the full logits). See cache.py for the format.

Work is split by shard: rank r of W (torchrun, any number of nodes sharing the output
directory) writes shards r, r + W, ... Each shard is written whole or not at all, so a
run killed at any point and started again redoes only the shards it had not finished.
A target that does not fit one device is spread over a node's GPUs with ``device_map``
(accelerate); each process then holds one copy over several devices.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from eagle_train.target_model.cache import (
    FORMAT,
    FORMAT_VERSION,
    IDENTITY,
    MANIFEST,
    FeatureCacheError,
    dataset_sha256,
    mismatches,
    shard_name,
    tensor_names,
    write_atomic,
    write_json,
)
from eagle_train.target_model.frozen import FrozenTarget
from eagle_train.target_model.weights import target_identity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractSettings:
    shard_mib: float = 1024  # bytes of features per shard file (MiB)
    batch_tokens: int = 16384  # padded tokens per target forward
    device_map: str | None = None  # "auto": spread the target over this node's GPUs


@dataclass
class SplitReport:
    path: Path
    rows: int
    tokens: int
    shards: int
    written: int  # shards this process wrote (the rest were done already or by others)
    seconds: float


def cache_identity(target_path: Path, dtype: str, layer_ids: list[int], data: Path) -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "target": target_identity(target_path),
        "layer_ids": sorted(layer_ids),
        "dataset": dataset_sha256(data),
        "dataset_path": str(Path(data).resolve()),
        "dtype": dtype,
    }


def open_split(out: Path, identity: dict[str, Any], is_main: bool) -> None:
    """Create ``out`` with its identity, or check that the identity there is this one."""
    found_file = out / IDENTITY
    if found_file.is_file():
        found = _read_json(found_file)
        problems = mismatches(identity, found) if "target" in found else ["not a cache"]
        if not problems and found.get("format_version") != identity["format_version"]:
            problems.append(
                f"format {found.get('format_version')} (this eagle-train writes format "
                f"{identity['format_version']})"
            )
        if not problems and found["shards"] != identity["shards"]:
            problems.append("the shard plan differs (another shard_mib)")
        if found["layer_ids"] != identity["layer_ids"] and not problems:
            problems.append(f"layer set {found['layer_ids']} vs {identity['layer_ids']}")
        if problems:
            raise FeatureCacheError(
                f"{out} holds features made for something else: {'; '.join(problems)}. "
                "Choose another data.features directory"
            )
        return
    if out.exists() and any(out.iterdir()):
        raise FeatureCacheError(f"{out} exists and is not a feature cache; choose another path")
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_json(found_file, identity)


def _read_json(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as exc:
        raise FeatureCacheError(f"{path}: malformed JSON ({exc})") from None


def shard_done(out: Path, index: int) -> bool:
    name = shard_name(index)
    shard, info = out / f"{name}.safetensors", out / f"{name}.json"
    if not (shard.is_file() and info.is_file()):
        return False
    return _read_json(info).get("bytes") == shard.stat().st_size


@torch.no_grad()
def extract_rows(
    target: FrozenTarget,
    rows: list[list[int]],
    layer_ids: list[int],
    batch_tokens: int,
    device: torch.device,
) -> list[dict[str, torch.Tensor]]:
    """Per row (in order), ``hidden.K`` and ``final`` (len, H) and ``greedy`` (len,) int32
    on the CPU. Rows are batched longest first under ``batch_tokens`` padded tokens."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    out: list[dict[str, torch.Tensor]] = [{} for _ in rows]
    names = tensor_names(layer_ids, greedy=True)
    h = target.config.hidden_size
    i = 0
    while i < len(order):
        width = len(rows[order[i]])
        count = max(1, batch_tokens // max(width, 1))
        chunk = order[i : i + count]
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for b, r in enumerate(chunk):
            ids[b, : len(rows[r])] = torch.tensor(rows[r])
            mask[b, : len(rows[r])] = 1
        feats = target.features(ids.to(device), mask.to(device), layer_ids)
        parts = [feats.aux[..., j * h : (j + 1) * h] for j in range(len(layer_ids))]
        parts += [feats.final, feats.greedy.int()]
        for b, r in enumerate(chunk):
            n = len(rows[r])
            out[r] = {name: p[b, :n].cpu() for name, p in zip(names, parts, strict=True)}
        i += len(chunk)
    return out


def write_shard(
    out: Path, index: int, features: list[dict[str, torch.Tensor]], started: float
) -> None:
    """Write one shard and its json; ``started`` (``time.perf_counter()`` when its extraction
    began) gives the json's ``seconds``, the shard's extraction and writing without the
    process's start (scripts/plan_budget.py sizes the feature stage from it)."""
    names = list(features[0])
    tensors = {name: torch.cat([f[name] for f in features]).contiguous() for name in names}
    lengths = [f[names[0]].shape[0] for f in features]
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths).cumsum(0)
    tensors["offsets"] = offsets
    data = save(tensors)
    name = shard_name(index)
    write_atomic(out / f"{name}.safetensors", data)
    info = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "rows": len(lengths),
        "tokens": int(offsets[-1]),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_json(out / f"{name}.json", info)


def finish_split(out: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The manifest, once every shard is complete (written atomically)."""
    files = []
    for i in range(len(identity["shards"])):
        if not shard_done(out, i):
            raise FeatureCacheError(f"{out}: {shard_name(i)} is missing or incomplete")
        files.append(_read_json(out / f"{shard_name(i)}.json"))
    manifest = {
        **identity,
        "files": files,
        "rows": sum(f["rows"] for f in files),
        "tokens": sum(f["tokens"] for f in files),
        "bytes": sum(f["bytes"] for f in files),
    }
    write_json(out / MANIFEST, manifest)
    return manifest


def clean_stale(out: Path) -> None:
    """Temporaries of a killed writer (this tool's own names only)."""
    for stale in (*out.glob(".shard-*.tmp-*"), *out.glob(f".{MANIFEST}.tmp-*")):
        stale.unlink(missing_ok=True)


def extract_split(
    target: FrozenTarget,
    rows: list[list[int]],
    out: Path,
    identity: dict[str, Any],
    settings: ExtractSettings,
    device: torch.device,
    rank: int,
    world_size: int,
) -> int:
    """Write this rank's missing shards; returns how many it wrote."""
    written = 0
    shards = identity["shards"]
    for index in range(rank, len(shards), world_size):
        if shard_done(out, index):
            continue
        start, end = shards[index]
        t0 = time.perf_counter()
        features = extract_rows(
            target, rows[start:end], identity["layer_ids"], settings.batch_tokens, device
        )
        write_shard(out, index, features, t0)
        written += 1
        log.info(
            "%s: %s rows %d..%d in %.1fs", out.name, shard_name(index), start, end,
            time.perf_counter() - t0,
        )  # fmt: skip
    return written
