"""Training throughput online (the target's forward at every step) vs from a feature cache,
the time to build the cache, and peak memory of each mode.

For each target (the default demo shape with random weights, saved once; and any --target
directory, e.g. SmolLM2), one subprocess builds a cache of random token rows through the
real extraction code (target forward, shard files, manifest), then one subprocess per
(mode, K) trains an EAGLE-3 draft on the same rows: online loads the whole target and runs
it per step; cached loads only the target's head and embeddings and reads the memory-mapped
shards. Peak memory is the process's peak RSS (CPU) or max_memory_allocated (CUDA).

    python benchmarks/bench_features.py --target /work/cache/smollm2/bf16 --aux-layer-ids 2 15 27
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import load_target, measure_steps


def _peak_mib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def _rows(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(0)
    return torch.randint(3, vocab, (args.rows, args.seq), generator=gen).tolist()


def build(args: argparse.Namespace, path: str, out: Path) -> dict:
    import torch

    from eagle_train.target_model import FrozenTarget
    from eagle_train.target_model.cache import plan_shards
    from eagle_train.target_model.extract import extract_split, finish_split
    from eagle_train.target_model.weights import target_identity

    device = torch.device(args.device)
    t0 = time.perf_counter()
    target = FrozenTarget.from_pretrained(path, torch.bfloat16, str(device))
    load_s = time.perf_counter() - t0
    rows = _rows(args, target.config.vocab_size)
    identity = {
        "format_version": 1,
        "target": target_identity(path),
        "layer_ids": sorted(args.aux_layer_ids),
        "dataset": "bench-random",
        "dtype": "bfloat16",
        "shards": plan_shards([len(r) for r in rows], 2 * args.seq),
    }
    out.mkdir(parents=True)
    settings = argparse.Namespace(batch_tokens=args.batch_tokens)
    t0 = time.perf_counter()
    extract_split(target, rows, out, identity, settings, device, 0, 1)
    manifest = finish_split(out, identity)
    seconds = time.perf_counter() - t0
    return {
        "build_s": seconds,
        "load_target_s": load_s,
        "extract_tokens_per_s": manifest["tokens"] / seconds,
        "cache_MiB": manifest["bytes"] / 2**20,
        "bytes_per_token": manifest["bytes"] / manifest["tokens"],
        "peak_MiB": _peak_mib(device),
    }


def train_point(args: argparse.Namespace, path: str, cache: Path, mode: str, k: int) -> dict:
    import torch

    from eagle_train.data.loader import Batch
    from eagle_train.data.vocab import build_vocab_mapping
    from eagle_train.drafts.eagle3.config import Eagle3Config
    from eagle_train.drafts.registry import get_draft
    from eagle_train.optim import OptimConfig, create_optimizer
    from eagle_train.target_model import FrozenTarget
    from eagle_train.target_model.cache import FeatureCache
    from eagle_train.target_model.source import CachedFeatures, OnlineFeatures
    from eagle_train.target_model.weights import load_target_head

    torch.manual_seed(0)
    device = torch.device(args.device)
    if mode == "online":
        target = FrozenTarget.from_pretrained(path, torch.bfloat16, str(device))
    else:
        target = load_target_head(path, torch.bfloat16, device)
    spec = get_draft("eagle3")
    cfg = Eagle3Config(aux_layer_ids=args.aux_layer_ids, ttt_steps=k)
    layer_ids = spec.target_layer_ids(cfg, target.description)
    if mode == "online":
        source = OnlineFeatures(target, layer_ids)
    else:
        source = CachedFeatures(FeatureCache(cache), target.lm_head(), layer_ids, device)
    rows = torch.tensor(_rows(args, target.config.vocab_size))
    vocab = None
    if args.draft_vocab:  # the most frequent ids of the rows, as the trainer builds it
        counts = torch.bincount(rows.flatten(), minlength=target.config.vocab_size)
        vocab = build_vocab_mapping(counts, min(args.draft_vocab, target.config.vocab_size))
    draft = spec.build(cfg, target, vocab).to(device=device, dtype=torch.bfloat16)
    optimizer = create_optimizer(draft, OptimConfig(lr=1e-4))
    position = [0]

    def step() -> None:
        start = position[0] % (args.rows - args.batch + 1)
        position[0] += args.batch
        ids = rows[start : start + args.batch].to(device)
        ones = torch.ones_like(ids)
        lengths = torch.full((args.batch,), args.seq, device=device)
        index = torch.arange(start, start + args.batch)
        batch = Batch(ids, ones, ones, lengths, rows=index)
        features = source.for_batch(batch)
        spec.compute_loss(draft, features, batch, cfg).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    _, _, step_s = measure_steps(step, args.steps, device)
    return {
        "mode": mode,
        "K": k,
        "draft_vocab": len(vocab.d2t) if vocab is not None else target.config.vocab_size,
        "tokens_per_s": args.batch * args.seq / step_s,
        "step_s": step_s,
        "peak_MiB": _peak_mib(device),
    }


def _sub(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def save_demo_target(root: Path) -> str:
    """The default demo target's shape with random weights, saved like any target."""
    import torch

    target = load_target(None, "llama", torch.device("cpu"))
    path = root / "demo-target"
    target.model.save_pretrained(path)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=None, help="HF target dir, benchmarked after demo")
    parser.add_argument("--aux-layer-ids", type=int, nargs=3, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 7])
    parser.add_argument("--draft-vocab", type=int, help="draft vocabulary (default: the target's)")
    parser.add_argument("--point", nargs=4, help=argparse.SUPPRESS)  # kind path cache K
    args = parser.parse_args()
    if args.point:
        kind, path, cache, k = args.point
        if kind == "build":
            result = build(args, path, Path(cache))
        else:
            result = train_point(args, path, Path(cache), kind, int(k))
        print(json.dumps(result))
        return
    passthrough = [a for a in sys.argv[1:]]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        targets = [("demo", save_demo_target(Path(tmp)), [1, 2, 3])]
        if args.target:
            targets.append((Path(args.target).name, args.target, args.aux_layer_ids))
        for name, path, aux in targets:
            extra = ["--aux-layer-ids", *map(str, aux)] if aux else []
            cache = str(Path(tmp) / f"cache-{name}")
            row = {
                "target": name,
                **_sub([*passthrough, *extra, "--point", "build", path, cache, "0"]),
            }
            print(json.dumps(row), flush=True)
            results.append(row)
            for k in args.ks:
                for mode in ("online", "cached"):
                    point = _sub([*passthrough, *extra, "--point", mode, path, cache, str(k)])
                    row = {"target": name, **point}
                    print(json.dumps(row), flush=True)
                    results.append(row)
    print_table(results)


def print_table(results: list[dict]) -> None:
    print(
        "\n| target | K | online tok/s | cached tok/s | ratio | online peak MiB | cached peak MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    by = {(r["target"], r.get("mode"), r.get("K")): r for r in results}
    for (target, mode, k), r in by.items():
        if mode != "online":
            continue
        c = by[(target, "cached", k)]
        print(
            f"| {target} | {k} | {r['tokens_per_s']:.0f} | {c['tokens_per_s']:.0f} | "
            f"{c['tokens_per_s'] / r['tokens_per_s']:.2f} | {r['peak_MiB']:.0f} | "
            f"{c['peak_MiB']:.0f} |"
        )
    for r in results:
        if "build_s" in r:
            print(
                f"cache build, {r['target']}: {r['build_s']:.1f}s "
                f"({r['extract_tokens_per_s']:.0f} tokens/s), {r['cache_MiB']:.1f} MiB, "
                f"{r['bytes_per_token']:.0f} B/token, peak {r['peak_MiB']:.0f} MiB"
            )


if __name__ == "__main__":
    main()
