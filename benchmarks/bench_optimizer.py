#!/usr/bin/env python
"""Benchmark MasterWeightAdamW against torch's AdamW: step time, memory, bandwidth.

    python benchmarks/bench_optimizer.py                       # 10M, 30M, 100M params on CPU
    python benchmarks/bench_optimizer.py --sizes 10M --steps 20
    python benchmarks/bench_optimizer.py --device cuda --sizes 100M,300M

Variants: MasterWeightAdamW on bf16 params (compiled / fused / foreach kernels), torch's
AdamW on fp32 params of the same count (fused / foreach) and plain AdamW on bf16 params.
Per variant: median step time, its ratio to torch's fastest fp32 AdamW (target for
master/compiled: <= 1.15), resident bytes per param (params + grads + state), optimizer
state bytes per param (per-element state; 12 for bf16 params with masters), extra peak
bytes per param inside the step, modelled bytes moved per param and the bandwidth this
achieves next to measured large-copy and in-place-add bandwidths. Prints figures; it is
not a test. On the 2-vCPU CPU machines run it with --threads 1: there every parallel
region that wakes the second thread can cost ~8 ms, which swamps the kernels.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eagle_train.optim import MasterWeightAdamW  # noqa: E402

# Bytes read + written per parameter by one step, by construction of each kernel:
# fused AdamW reads p, g, m, v and writes p, m, v; the master paths add the bf16 grad
# cast (2 + 4) and the copy-back (4 + 2) unless compiled into the same pass; torch's
# foreach path runs 8 separate elementwise ops (mul, lerp, mul, addcmul, sqrt, div, add,
# addcdiv: 80 bytes in fp32).
BYTES_MOVED = {
    "master/compiled": 28,
    "master/fused": 40,
    "master/foreach": 92,
    "torch-fp32/fused": 28,
    "torch-fp32/foreach": 80,
    "torch-bf16/fused": 14,
    "torch-bf16/foreach": 40,
}
HYPER = {"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01}


@dataclass
class Result:
    variant: str
    step_ms: float
    resident_bpp: float
    state_bpp: float
    peak_extra_bpp: float | None


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1], 1)
    return int(float(text.rstrip("KMG")) * scale)


def split_shapes(num_params: int, num_tensors: int) -> list[tuple[int, int]]:
    """Roughly equal 2-D tensors with a 1024-wide last dim (draft-like, vector-friendly)."""
    rows = max(1, num_params // (1024 * num_tensors))
    return [(rows, 1024)] * num_tensors


def build(variant: str, shapes: list[tuple[int, int]], device: torch.device):
    family, kernel = variant.split("/")
    dtype = torch.float32 if family == "torch-fp32" else torch.bfloat16
    params = [torch.nn.Parameter(torch.randn(s, device=device).to(dtype)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, device=device).to(dtype) * 1e-3
    if family == "master":
        opt: torch.optim.Optimizer = MasterWeightAdamW(params, **HYPER, implementation=kernel)
    else:
        flag = {"fused": True} if kernel == "fused" else {"foreach": True}
        opt = torch.optim.AdamW(params, **HYPER, **flag)
    return params, opt


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def read_rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure_peak_extra(step: Callable[[], None], device: torch.device) -> int | None:
    """Bytes allocated on top of the resident set while one step runs."""
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    try:  # Linux: writing 5 to clear_refs resets the peak-RSS counter (VmHWM).
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    base = read_rss_kib("VmRSS")
    step()
    return max(0, read_rss_kib("VmHWM") - base) * 1024


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def bench_variant(variant: str, shapes: list[tuple[int, int]], args: argparse.Namespace) -> Result:
    device = torch.device(args.device)
    params, opt = build(variant, shapes, device)
    n = sum(p.numel() for p in params)
    for _ in range(args.warmup):  # includes the one-time compile of the compiled path
        opt.step()
    peak = measure_peak_extra(opt.step, device)
    times = []
    for _ in range(args.steps):
        sync(device)
        start = time.perf_counter()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - start)
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    per_element_state = [t for t in state if t.dim() > 0]  # leaves out the step counters
    resident = tensor_bytes(params) + tensor_bytes(p.grad for p in params) + tensor_bytes(state)
    result = Result(
        variant=variant,
        step_ms=statistics.median(times) * 1e3,
        resident_bpp=resident / n,
        state_bpp=tensor_bytes(per_element_state) / n,
        peak_extra_bpp=None if peak is None else peak / n,
    )
    del params, opt, state, per_element_state
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def ceiling_bandwidths(device: torch.device, num_floats: int = 64 * 2**20) -> tuple[float, float]:
    """GB/s of a large fp32 copy (read + write) and of an in-place ``a += b`` (read 2, write
    1 into lines already read: no write-allocate, like the in-place optimizer kernels)."""
    a = torch.randn(num_floats, device=device)
    b = torch.randn(num_floats, device=device)
    results = []
    for op, nbytes in ((lambda: b.copy_(a), 8), (lambda: a.add_(b), 12)):
        op()
        times = []
        for _ in range(10):
            sync(device)
            start = time.perf_counter()
            op()
            sync(device)
            times.append(time.perf_counter() - start)
        results.append(nbytes * num_floats / min(times) / 1e9)
    return results[0], results[1]


def print_table(num_params: int, results: list[Result], copy_gbps: float, add_gbps: float) -> None:
    fp32 = [r.step_ms for r in results if r.variant.startswith("torch-fp32/")]
    fastest = min(fp32) if fp32 else float("nan")
    print(f"\n== {num_params / 1e6:.0f}M params ==")
    header = (
        f"{'variant':<20}{'step ms':>9}{'vs fp32':>9}{'resid B/p':>11}{'state B/p':>11}"
        f"{'peak+ B/p':>11}{'moved B/p':>11}{'GB/s':>8}{'% copy':>8}{'% add_':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if r.variant.startswith("master/") and r.state_bpp != 12:
            print(f"!! {r.variant}: {r.state_bpp} state bytes per bf16 param, expected 12")
        moved = BYTES_MOVED[r.variant]
        gbps = moved * num_params / (r.step_ms / 1e3) / 1e9
        peak = "n/a" if r.peak_extra_bpp is None else f"{r.peak_extra_bpp:.1f}"
        print(
            f"{r.variant:<20}{r.step_ms:>9.1f}{r.step_ms / fastest:>9.2f}{r.resident_bpp:>11.1f}"
            f"{r.state_bpp:>11.1f}{peak:>11}{moved:>11}{gbps:>8.1f}{100 * gbps / copy_gbps:>8.0f}"
            f"{100 * gbps / add_gbps:>8.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10M,30M,100M", help="comma list, e.g. 10M,30M")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    parser.add_argument("--tensors", type=int, default=16, help="tensors the params split into")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--variants", default=",".join(BYTES_MOVED), help="comma list of: " + ",".join(BYTES_MOVED)
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in BYTES_MOVED]
    if unknown:
        parser.error(f"unknown variants {unknown}")
    device = torch.device(args.device)
    copy_gbps, add_gbps = ceiling_bandwidths(device)
    print(
        f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
        f"cpu capability {torch.backends.cpu.get_cpu_capability()}, "
        f"large-copy bandwidth {copy_gbps:.1f} GB/s, in-place add {add_gbps:.1f} GB/s; "
        f"median of {args.steps} steps"
    )
    for size in args.sizes.split(","):
        shapes = split_shapes(parse_size(size), args.tensors)
        results = [bench_variant(v, shapes, args) for v in variants]
        print_table(sum(r * c for r, c in shapes), results, copy_gbps, add_gbps)


if __name__ == "__main__":
    main()
