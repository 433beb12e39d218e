"""The feature cache on disk: what the target computed, per token, for one prepared dataset.

One split (``train`` or ``val``) is one directory:

- ``identity.json``: written first: the target (config sha256, weight-file fingerprint),
  the layer set, the dataset (sha256 of its files), the dtype and the shard plan (row
  ranges). A later run that resumes into the directory must present the same identity.
- ``shard-NNNNN.safetensors``: rows ``[start, end)`` of the dataset, their tokens
  concatenated: ``hidden.K`` (N, H) for each layer count K, ``final`` (N, H) the last
  hidden state after the final norm, ``greedy`` (N,) int32 the target's argmax next token
  (format 2; a format 1 cache lacks it and the trainer recomputes it from the full logits
  every step), ``offsets`` (rows + 1,) int64. Written to a temporary
  name, fsynced and renamed, then its ``shard-NNNNN.json`` (bytes, sha256, rows, tokens):
  a shard with both files is complete, anything else is redone.
- ``manifest.json``: the identity plus every shard's size and sha256, written (atomically)
  when every shard is there. A split without it is not a cache yet.

Reads are memory-mapped (``safe_open``): a batch touches only its rows' slices.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from eagle_train.errors import UserError
from eagle_train.fsutil import confined

IDENTITY = "identity.json"
MANIFEST = "manifest.json"
FORMAT = "eagle-train-features"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: no greedy tokens


class FeatureCacheError(UserError, ValueError):
    """A cache that is missing, incomplete, corrupt or made for something else."""


def tensor_names(layer_ids: list[int], greedy: bool) -> list[str]:
    """A shard's per-token tensors for ``layer_ids``, ``greedy`` where the format has it."""
    return [f"hidden.{k}" for k in layer_ids] + ["final"] + (["greedy"] if greedy else [])


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def dataset_sha256(path: str | Path) -> str:
    """The prepared dataset's identity: meta.json and every Arrow file, in name order."""
    path = Path(path)
    files = [path / "meta.json", *sorted(path.glob("*.arrow"))]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def plan_shards(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive row ranges ``[start, end)`` of at most ``max_tokens`` tokens each (a
    longer row gets a shard of its own)."""
    ranges, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and tokens + n > max_tokens:
            ranges.append([start, i])
            start, tokens = i, 0
        tokens += n
    if lengths:
        ranges.append([start, len(lengths)])
    return ranges


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all (temporary name, fsync, rename)."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(path)
    except BaseException:  # a full disk: the partial temporary would hold the space
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, value: Any) -> None:
    write_atomic(path, (json.dumps(value, indent=2) + "\n").encode())


def mismatches(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """What differs between two identities, one phrase per difference."""
    out = []
    for key in ("target", "layer_ids", "dataset", "dtype"):
        if key == "target":
            for part in ("config_sha256", "weights_fingerprint"):
                if expected["target"][part] != found["target"][part]:
                    out.append(
                        f"target: the cache was made for {found['target']['path']} "
                        f"({part} {found['target'][part][:12]}), this run's target "
                        f"{expected['target']['path']} has {expected['target'][part][:12]}"
                    )
        elif key == "layer_ids":
            missing = sorted(set(expected["layer_ids"]) - set(found["layer_ids"]))
            if missing:
                out.append(
                    f"layer set: the cache holds layers {found['layer_ids']}, this run reads "
                    f"{expected['layer_ids']} (missing {missing})"
                )
        elif expected[key] != found[key]:
            out.append(f"{key}: the cache was made for {found[key]}, this run has {expected[key]}")
    return out


def read_manifest(path: Path) -> dict[str, Any]:
    """A cache's manifest, checked for the keys a reader indexes (a cut or hand-edited one is
    named in one line, not a KeyError)."""
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FeatureCacheError(
            f"{path}: unreadable ({exc}); run prepare-features again to rewrite it"
        ) from None
    if not isinstance(manifest, dict):
        raise FeatureCacheError(f"{path}: expected a JSON object")
    files, shards = manifest.get("files"), manifest.get("shards")
    ok = (
        isinstance(files, list)
        and isinstance(shards, list)
        and len(files) == len(shards)
        and all(isinstance(f, dict) and isinstance(f.get("bytes"), int) for f in files)
        and all(isinstance(s, list) and len(s) == 2 for s in shards)
    )
    if not ok:
        raise FeatureCacheError(
            f"{path}: expected 'files' (one {{bytes, sha256, ...}} per shard) and 'shards' (one "
            "[start, end] per shard); run prepare-features again to rewrite it"
        )
    return manifest


class FeatureCache:
    """One complete split, opened for memory-mapped reads."""

    def __init__(self, path: str | Path, check_sizes: bool = True) -> None:
        self.path = Path(path)
        manifest_file = self.path / MANIFEST
        if not manifest_file.is_file():
            why = "incomplete (run prepare-features again to finish it)"
            if not (self.path / IDENTITY).is_file():
                why = "not a feature cache (run prepare-features)"
            raise FeatureCacheError(f"{self.path}: {why}: no {MANIFEST}")
        self.manifest = read_manifest(manifest_file)
        if self.manifest.get("format_version") not in READABLE_VERSIONS:
            raise FeatureCacheError(
                f"{manifest_file}: format_version {self.manifest.get('format_version')}, "
                f"this code reads {' or '.join(map(str, READABLE_VERSIONS))}"
            )
        self.starts = [start for start, _ in self.manifest["shards"]]
        if check_sizes:
            for i, entry in enumerate(self.manifest["files"]):
                file = self.shard_file(i)
                size = file.stat().st_size if file.is_file() else None
                if size != entry["bytes"]:
                    raise FeatureCacheError(
                        f"{file}: {size} bytes on disk, the manifest records {entry['bytes']}"
                    )
        self._open: dict[int, Any] = {}

    @property
    def layer_ids(self) -> list[int]:
        return self.manifest["layer_ids"]

    @property
    def num_rows(self) -> int:
        return self.manifest["shards"][-1][1] if self.starts else 0

    @property
    def has_greedy(self) -> bool:
        """The target's greedy tokens are stored (format 2)."""
        return self.manifest["format_version"] >= 2

    def check(self, expected: dict[str, Any]) -> None:
        problems = mismatches(expected, self.manifest)
        if problems:
            raise FeatureCacheError(
                f"{self.path} was made for something else: " + "; ".join(problems)
            )

    def shard_file(self, index: int) -> Path:
        """Shard ``index``'s file, refused when a symlink leads it out of the cache."""
        return confined(self.path, f"{shard_name(index)}.safetensors", self.path / MANIFEST)

    def _shard(self, index: int):
        if index not in self._open:
            file = self.shard_file(index)
            # Each shard is hashed on its first read by this process (one sequential read
            # of its bytes), so a corrupt shard is named instead of training on garbage.
            if _sha256(file) != self.manifest["files"][index]["sha256"]:
                raise FeatureCacheError(
                    f"{file}: sha256 differs from the one {self.path / MANIFEST} records "
                    "(corrupt): rebuild this cache with prepare-features"
                )
            try:
                handle = safe_open(file, framework="pt")
            except Exception as exc:  # SafetensorError: a bad header
                raise FeatureCacheError(
                    f"{file}: not a readable safetensors file ({exc})"
                ) from None
            self._open[index] = (handle, handle.get_tensor("offsets").tolist())
        return self._open[index]

    def row(self, row: int, length: int, names: list[str]) -> list[Tensor]:
        """The first ``length`` tokens of dataset row ``row``: one tensor per name, (length,
        H) for ``hidden.K`` and ``final``, (length,) for ``greedy``, read from the memory map."""
        index = bisect.bisect_right(self.starts, row) - 1
        handle, offsets = self._shard(index)
        local = row - self.starts[index]
        begin, end = offsets[local], offsets[local + 1]
        if length > end - begin:
            raise FeatureCacheError(
                f"{self.path}: row {row} has {end - begin} cached tokens, the batch asks {length}"
            )
        return [handle.get_slice(name)[begin : begin + length] for name in names]


class CacheChain:
    """Several caches read as one, their rows end to end (a data.train mixture's sources,
    in its order: the rows the mixture's loader hands out)."""

    def __init__(self, caches: list[FeatureCache]) -> None:
        self.caches = caches
        self.has_greedy = all(cache.has_greedy for cache in caches)
        self.starts = [0]
        for cache in caches[:-1]:
            self.starts.append(self.starts[-1] + cache.num_rows)

    def row(self, row: int, length: int, names: list[str]) -> list[Tensor]:
        index = bisect.bisect_right(self.starts, row) - 1
        return self.caches[index].row(row - self.starts[index], length, names)


def verify_cache(path: str | Path) -> list[str]:
    """Every shard's sha256 against the manifest: the problems found (none: intact)."""
    cache = FeatureCache(path)
    problems = []
    for i, entry in enumerate(cache.manifest["files"]):
        file = cache.shard_file(i)
        if _sha256(file) != entry["sha256"]:
            problems.append(f"{file}: sha256 differs from the manifest (corrupt)")
    return problems


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def stack_rows(rows: list[list[Tensor]], total: int) -> list[Tensor]:
    """Per name, the rows right-padded with zeros to ``total`` tokens: (B, total, ...)."""
    out = []
    for parts in zip(*rows, strict=True):
        batch = torch.zeros(len(parts), total, *parts[0].shape[1:], dtype=parts[0].dtype)
        for i, part in enumerate(parts):
            batch[i, : part.shape[0]] = part
        out.append(batch)
    return out
