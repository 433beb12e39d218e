"""Files as an older eagle-train wrote them, made by that version's code path (mirrored here,
naming the commit), never by relabelling what this version writes: a stand-in for a user's
old file must lack what the old code never wrote, or code that wrongly asks for it passes.

Feature cache format 1: ``prepare-features`` at commit 0238302, the parent of 6875860 (which
introduced format 2 and its stored greedy tokens). Its identity helpers (``target_identity``,
``dataset_sha256``, ``plan_shards``) are unchanged since, so they are imported, not copied.

A prepared dataset from before the token counts: ``prepare-data`` at commit 3c5722e^, the parent
of 3c5722e (which replaced ``vocab.safetensors`` by ``token_counts.safetensors``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from eagle_train.data.loader import PreparedData
from eagle_train.data.vocab import build_vocab_mapping, load_token_counts, save_vocab_mapping
from eagle_train.target_model import FrozenTarget
from eagle_train.target_model.cache import dataset_sha256, plan_shards
from eagle_train.target_model.weights import target_identity

FORMAT_1_COMMIT = "0238302"  # the last commit whose prepare-features wrote format 1
BEFORE_COUNTS_COMMIT = "3c5722e^"  # the last commit whose prepare-data wrote vocab.safetensors


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


@torch.no_grad()
def _extract_rows(
    target: FrozenTarget, rows: list[list[int]], layer_ids: list[int], batch_tokens: int
) -> list[dict[str, torch.Tensor]]:
    """0238302 ``target/extract.py: extract_rows``: ``hidden.K`` and ``final`` per row, rows
    batched longest first under ``batch_tokens`` padded tokens; no greedy tokens."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    out: list[dict[str, torch.Tensor]] = [{} for _ in rows]
    names = [f"hidden.{k}" for k in layer_ids] + ["final"]
    h = target.config.hidden_size
    i = 0
    while i < len(order):
        width = len(rows[order[i]])
        chunk = order[i : i + max(1, batch_tokens // max(width, 1))]
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for b, r in enumerate(chunk):
            ids[b, : len(rows[r])] = torch.tensor(rows[r])
            mask[b, : len(rows[r])] = 1
        feats = target.features(ids, mask, layer_ids)
        parts = [feats.aux[..., j * h : (j + 1) * h] for j in range(len(layer_ids))]
        parts.append(feats.final)
        for b, r in enumerate(chunk):
            out[r] = {name: p[b, : len(rows[r])] for name, p in zip(names, parts, strict=True)}
        i += len(chunk)
    return out


def write_feature_cache_format_1(
    target: FrozenTarget,
    target_path: Path,
    data: Path,
    out: Path,
    layer_ids: list[int],
    shard_mib: float = 1,
    batch_tokens: int = 16384,
) -> Path:
    """One split of a format 1 feature cache at ``out``, as 0238302's prepare-features wrote
    it (``features.py: _prepare_split``, ``target/extract.py: cache_identity, write_shard,
    finish_split``): shards hold ``hidden.K``, ``final`` and ``offsets`` only, each shard's
    json {bytes, sha256, rows, tokens}, the manifest the identity plus files, rows, tokens,
    bytes. ``target`` is the whole target loaded from ``target_path`` in bfloat16."""
    rows = PreparedData(data).rows["input_ids"]
    layer_ids = sorted(layer_ids)
    identity: dict[str, Any] = {
        "format": "eagle-train-features",
        "format_version": 1,
        "target": target_identity(target_path),
        "layer_ids": layer_ids,
        "dataset": dataset_sha256(data),
        "dataset_path": str(Path(data).resolve()),
        "dtype": "bfloat16",
    }
    width = (len(set(layer_ids)) + 1) * target.config.hidden_size * target.dtype.itemsize
    per_shard = max(1, int(shard_mib * 2**20) // width)
    identity["shards"] = plan_shards([len(r) for r in rows], per_shard)
    out.mkdir(parents=True)
    _write_json(out / "identity.json", identity)
    files = []
    for index, (start, end) in enumerate(identity["shards"]):
        features = _extract_rows(target, rows[start:end], layer_ids, batch_tokens)
        names = list(features[0])
        tensors = {name: torch.cat([f[name] for f in features]).contiguous() for name in names}
        lengths = [f[names[0]].shape[0] for f in features]
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor(lengths).cumsum(0)
        tensors["offsets"] = offsets
        blob = save(tensors)
        (out / f"shard-{index:05d}.safetensors").write_bytes(blob)
        info = {
            "bytes": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(),
            "rows": len(lengths),
            "tokens": int(offsets[-1]),
        }
        _write_json(out / f"shard-{index:05d}.json", info)
        files.append(info)
    manifest = {
        **identity,
        "files": files,
        "rows": sum(f["rows"] for f in files),
        "tokens": sum(f["tokens"] for f in files),
        "bytes": sum(f["bytes"] for f in files),
    }
    _write_json(out / "manifest.json", manifest)
    return out


def as_dataset_before_token_counts(data: Path, draft_vocab_size: int | None) -> Path:
    """Turn ``data``, just written by prepare-data, into what 3c5722e^'s prepare-data wrote for
    the same chats (its rows, Arrow files and other meta fields are written as they were then):
    ``vocab.safetensors``, the mapping of ``draft_vocab_size`` built from the same counts
    (``build_vocab_mapping`` and ``save_vocab_mapping``, unchanged since), in place of
    ``token_counts.safetensors``; meta.json's ``token_counts`` entry replaced by ``vocab``
    ({file, draft_vocab_size, target_vocab_size}, null without a size, when no file was
    written) and its ``files`` sizes taken again (``store.write_meta``)."""
    counts = load_token_counts(data / "token_counts.safetensors")
    (data / "token_counts.safetensors").unlink()
    vocab = None
    if draft_vocab_size:
        save_vocab_mapping(
            build_vocab_mapping(counts, draft_vocab_size), data / "vocab.safetensors"
        )
        vocab = {
            "file": "vocab.safetensors",
            "draft_vocab_size": draft_vocab_size,
            "target_vocab_size": len(counts),
        }
    now = json.loads((data / "meta.json").read_text())
    meta = {}
    for key, value in now.items():
        if key == "token_counts":
            meta["vocab"] = vocab  # where 3c5722e^'s _meta put it: after regeneration
        elif key != "files":
            meta[key] = value
    meta["files"] = {
        str(p.relative_to(data)): p.stat().st_size
        for p in sorted(data.rglob("*"))
        if p.is_file() and p.name != "meta.json"
    }
    _write_json(data / "meta.json", meta)
    return data
