"""Training throughput of one run config from each of several feature caches of the same rows
(e.g. a format-1 cache, which makes the trainer compute the target's full logits every step,
against a format-2 cache holding the target's greedy tokens): one `train-draft` process per
cache, one after the other, into a temporary directory; prints the mean logged tokens/s and
supervised tokens/s over the steps after the warm-up, and the load average.

    python benchmarks/bench_train_from_cache.py -c configs/train/eagle3-smollm2.yaml \
        --features runs/real_data/default/features-4064-v1 \
        --features runs/real_data/default/features-4064 \
        --set target.path=runs/smollm2/bf16 --set data.train=runs/real_data/default/train-4064
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from eagle_train.metrics import read_metrics


def measure(args: argparse.Namespace, features: str, out: Path) -> dict:
    sets = [
        *args.set,
        f"data.features={features}",
        f"train.output_dir={out}",
        f"train.max_steps={args.warmup + args.steps}",
        f"train.log_every={args.log_every}",
        f"train.save_every={args.warmup + args.steps}",
        "train.progress=false",
        "train.tensorboard=false",
        "train.acceptance.every=null",
    ]
    command = [sys.executable, "-m", "eagle_train.cli", "train-draft", "-c", args.config]
    for value in sets:
        command += ["--set", value]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    timed = [r for r in read_metrics(out / "metrics.jsonl") if r["step"] > args.warmup]
    return {
        "features": features,
        "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in timed),
        "supervised_tokens_per_s": statistics.mean(r["supervised_tokens_per_s"] for r in timed),
        "steps": args.steps,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--features", action="append", required=True, help="a cache directory")
    parser.add_argument("--set", action="append", default=[], help="a train-draft override")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the mean")
    parser.add_argument("--steps", type=int, default=60, help="steps timed")
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    if args.warmup % args.log_every or args.steps % args.log_every:
        parser.error("--warmup and --steps must be multiples of --log-every")
    with tempfile.TemporaryDirectory() as tmp:
        results = [
            measure(args, features, Path(tmp) / f"run{i}")
            for i, features in enumerate(args.features)
        ]
    print("| features | tokens/s | supervised tokens/s | steps timed | load |")
    print("|---|--:|--:|--:|--:|")
    for r in results:
        print(
            f"| {r['features']} | {r['tokens_per_s']:.0f} | {r['supervised_tokens_per_s']:.0f} "
            f"| {r['steps']} | {r['load']:.2f} |"
        )


if __name__ == "__main__":
    main()
