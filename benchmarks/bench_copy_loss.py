"""Copy supervision's loss alone (``eagle_train/drafts/eagle3/copy_loss.py``): peak RSS and
time of one forward and backward per row length, each length in a fresh process, against
the T x T bound of the whole-row computation it replaced (rows x heads x T x T fp32 scores
and log-softmax per copy step, kept for backward).

    python benchmarks/bench_copy_loss.py --seqs 2048 8192
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch


def point(tokens: int, heads: int, head_dim: int, steps: int) -> dict:
    from eagle_train.drafts.eagle3.copy_loss import copy_attention_loss

    torch.manual_seed(0)
    ids = torch.randint(0, 49152, (1, tokens))
    ids[0, tokens // 2 :] = ids[0, : tokens - tokens // 2]  # the second half repeats the first
    probed = [
        tuple(torch.randn(1, heads, tokens, head_dim, requires_grad=True) for _ in range(2))
        for _ in range(steps)
    ]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    stats = copy_attention_loss(probed, ids, torch.ones_like(ids), torch.tensor([tokens]))
    stats.loss.backward()
    seconds = time.perf_counter() - start
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    whole_row = 2 * steps * heads * tokens * tokens * 4  # scores + log-softmax, every step
    return {
        "tokens": tokens,
        "peak_mib": peak / 2**20,
        "whole_row_scores_mib": whole_row / 2**20,
        "seconds": seconds,
        "loss": stats.loss.item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--heads", type=int, default=2, help="copy heads (draft.copy_heads)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="copy steps (draft.copy_steps)")
    parser.add_argument("--point", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point is not None:
        print(json.dumps(point(args.point, args.heads, args.head_dim, args.steps)))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # freed tensors leave RSS
    print("| tokens | peak RSS MiB | whole-row T x T scores MiB | seconds | loss |")
    print("|--:|--:|--:|--:|--:|")
    for tokens in args.seqs:
        cmd = [sys.executable, __file__, "--point", str(tokens), "--heads", str(args.heads)]
        cmd += ["--head-dim", str(args.head_dim), "--steps", str(args.steps)]
        row = json.loads(
            subprocess.run(
                cmd, env=env, check=True, capture_output=True, text=True
            ).stdout.splitlines()[-1]
        )
        print(
            f"| {tokens:,} | {row['peak_mib']:.0f} | {row['whole_row_scores_mib']:.0f} | "
            f"{row['seconds']:.1f} | {row['loss']:.5f} |"
        )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
