"""EAGLE-3 training throughput and peak memory vs sequence length and TTT steps K.

Each (seq, K) point runs in a fresh subprocess so that its peak memory is its own: on CUDA
torch.cuda.max_memory_allocated, on CPU the process's peak RSS, minus the same measure just
before the first step (target and draft weights loaded; the optimizer state is counted). Inputs are
random tokens through the real target, the real draft, the real loss and MasterWeightAdamW.

    python benchmarks/bench_train.py                       # demo target shape, seq 512/2048, K 1/3/7
    python benchmarks/bench_train.py --target runs/demo_world/targets/llama/bf16 --device cuda
    python benchmarks/bench_train.py --seqs 2048 --attention chunked   # the exact reference kernel
    python benchmarks/bench_train.py --seqs 2048 --alternate chunked,fused --steps 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def run_point(args: argparse.Namespace, seq: int, k: int) -> dict:
    import torch
    from benchlib import load_target, measure_steps

    from eagle_train.data.loader import Batch
    from eagle_train.drafts.eagle3.config import Eagle3Config
    from eagle_train.drafts.registry import get_draft
    from eagle_train.optim import OptimConfig, create_optimizer

    torch.manual_seed(0)
    device = torch.device(args.device)
    target = load_target(args.target, "llama", device)
    spec = get_draft("eagle3")
    cfg = Eagle3Config(aux_layer_ids=args.aux_layer_ids, ttt_steps=k, attention=args.attention)
    draft = spec.build(cfg, target, None).to(device=device, dtype=torch.bfloat16)
    optimizer = create_optimizer(draft, OptimConfig(lr=1e-4))
    vocab = target.config.vocab_size
    ids = torch.randint(3, vocab, (args.batch, seq), device=device)
    ones = torch.ones_like(ids)
    batch = Batch(ids, ones, ones, torch.full((args.batch,), seq, device=device))
    layer_ids = spec.target_layer_ids(cfg, target.description)

    def step() -> None:
        features = target.features(ids, ones, layer_ids)
        spec.compute_loss(draft, features, batch, cfg).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    _, peak, step_s = measure_steps(step, args.steps, device)
    return {
        "seq": seq,
        "K": k,
        "tokens_per_s": args.batch * seq / step_s,
        "step_s": step_s,
        "peak_extra_MiB": peak / 2**20,
    }


def alternate(args: argparse.Namespace, seq: int, k: int, backends: list[str]) -> dict:
    """Step time of each attention kernel, steps alternating between them in this process
    (a load change on a shared machine then hits every kernel alike); median per kernel."""
    import statistics
    import time

    import torch
    from benchlib import load_target

    from eagle_train.data.loader import Batch
    from eagle_train.drafts.eagle3.config import Eagle3Config
    from eagle_train.drafts.eagle_family import set_backend
    from eagle_train.drafts.registry import get_draft
    from eagle_train.optim import OptimConfig, create_optimizer

    torch.manual_seed(0)
    device = torch.device(args.device)
    target = load_target(args.target, "llama", device)
    spec = get_draft("eagle3")
    cfg = Eagle3Config(aux_layer_ids=args.aux_layer_ids, ttt_steps=k)
    draft = spec.build(cfg, target, None).to(device=device, dtype=torch.bfloat16)
    optimizer = create_optimizer(draft, OptimConfig(lr=1e-4))
    ids = torch.randint(3, target.config.vocab_size, (args.batch, seq), device=device)
    ones = torch.ones_like(ids)
    batch = Batch(ids, ones, ones, torch.full((args.batch,), seq, device=device))
    features = target.features(ids, ones, spec.target_layer_ids(cfg, target.description))
    times: dict[str, list[float]] = {b: [] for b in backends}
    for i in range(args.steps + 1):  # the first round is a warm-up
        for backend in backends if i % 2 == 0 else backends[::-1]:
            set_backend(draft, backend)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            spec.compute_loss(draft, features, batch, cfg).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times[backend].append(time.perf_counter() - start)
    return {"seq": seq, "K": k, **{b: statistics.median(t) for b, t in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=None, help="HF target dir (default: demo shape)")
    parser.add_argument("--aux-layer-ids", type=int, nargs=3, default=[1, 2, 3])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--attention", default="auto", help="draft.attention: auto/chunked/...")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 3, 7])
    parser.add_argument(
        "--alternate",
        help="comma list of draft.attention kernels: time the draft step (target features "
        "computed once) alternating between them, e.g. chunked,fused",
    )
    parser.add_argument("--point", type=int, nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.alternate:
        backends = args.alternate.split(",")
        for seq in args.seqs:
            for k in args.ks:
                row = alternate(args, seq, k, backends)
                times = "  ".join(f"{b} {row[b]:.3f}s" for b in backends)
                ratio = row[backends[0]] / row[backends[-1]]
                print(f"seq {seq:5d}  K {k}  draft step: {times}  ratio {ratio:.2f}x", flush=True)
        return
    if args.point:
        print(json.dumps(run_point(args, *args.point)))
        return

    passthrough = sys.argv[1:]
    rows = []
    for seq in args.seqs:
        for k in args.ks:
            out = subprocess.run(
                [sys.executable, __file__, *passthrough, "--point", str(seq), str(k)],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(
                f"seq {seq:5d}  K {k}  {rows[-1]['tokens_per_s']:9.0f} tok/s  "
                f"step {rows[-1]['step_s']:.3f}s  peak +{rows[-1]['peak_extra_MiB']:.1f} MiB",
                flush=True,
            )
    if len(args.ks) < 2:
        return  # one K: no growth per TTT step to report
    print("\nmemory growth per extra TTT step (MiB), from the K points:")
    for seq in args.seqs:
        pts = sorted((r["K"], r["peak_extra_MiB"]) for r in rows if r["seq"] == seq)
        slopes = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:], strict=False)]
        print(
            f"  seq {seq}: "
            + ", ".join(
                f"K {a[0]}->{b[0]}: {s:.1f}"
                for (a, b), s in zip(zip(pts, pts[1:], strict=False), slopes, strict=True)
            )
        )


if __name__ == "__main__":
    main()
