"""Size scripts/real_target.sh's planned budgets (BUDGET=90min, large) to a time budget on
the machine it runs on (its default, 4,064 conversations x 3 epochs, needs no plan).

Machines differ by more than 10x on this recipe (docs/results/2026-12-01-data-speed.md,
2026-12-03-smollm2-amx.md, 2026-12-05-budget-plan.md), so a fixed number of conversations
cannot promise a time. The recipe first runs its own stages on a small calibration set
(prepare-data, prepare-features, a few training steps and one vLLM probe), then this script
turns their measured costs into the number of conversations that fits the budget:

    dtype TARGET_DIR   the target's dtype here: bfloat16 unless fp32's forward is at least
                       1.25x faster (CPUs whose bf16 matrix units are missing or hidden);
                       prints float32 or bfloat16
    size ...           prints shell assignments PROMPTS=, EPOCHS=, PLANNED_*= (seconds) for
                       the recipe to source, and the plan in words on stderr
    steps ...          after the data and feature stages: prints STEPS=, the training steps
                       that fill the time left (at least one epoch), so what those stages
                       took under or over their plan goes to training instead of being lost

The model is linear in conversations: each one costs its answers' share of the calibration's
regeneration time, its prompt's share of synthesis time (per prompt that passed the filters:
the calibration asks for one batch of samples, which overshoots its 128 prompts, where the
full run's batches keep most of what they sample), its tokens' share of feature extraction
(the shards' own seconds, from the cache's manifest) and of EPOCHS training passes (steady
tokens/s). The data and feature stages' starts (imports, model load, engine start), the
probes and a fixed allowance come on top. Planned against measured seconds:
docs/results/2026-12-05-budget-plan.md and the pages after it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import NoReturn

from eagle_train.data.store import read_meta
from eagle_train.errors import UserError
from eagle_train.metrics import read_metrics
from eagle_train.target_model.cache import FeatureCache

FP32_MARGIN = 1.25  # fp32 must beat bf16 by this much: bf16 is what the target serves in
FIXED_S = 90.0  # subset, model loads, two exports and the random-init floor (measured: 60-80 s)
GRANULE = 16  # conversations: STEPS = EPOCHS * PROMPTS / 4 must split into 4 probe intervals
QUARTERS = 4  # training steps: four probe intervals and four saves
MIN_PROMPTS = 64


def forward_tokens_per_s(path: Path, dtype: str) -> float:
    import torch

    from eagle_train.target_model import FrozenTarget

    target = FrozenTarget.from_pretrained(path, getattr(torch, dtype), "cpu")
    ids = torch.randint(10, target.config.vocab_size, (4, 512), generator=torch.Generator())
    mask = torch.ones_like(ids)

    def forward() -> None:  # the layers, the final norm and the head's argmax
        target.features(ids, mask, [1]).logits.max(-1)

    with torch.no_grad():
        forward()  # warm-up
        start = time.perf_counter()
        for _ in range(2):
            forward()
    return 2 * ids.numel() / (time.perf_counter() - start)


def choose_dtype(target_dir: Path) -> str:
    bf16 = forward_tokens_per_s(target_dir / "bf16", "bfloat16")
    fp32 = forward_tokens_per_s(target_dir / "fp32", "float32")
    choice = "float32" if fp32 >= FP32_MARGIN * bf16 else "bfloat16"
    print(
        f"target forward on this CPU: bf16 {bf16:.0f} tokens/s, fp32 {fp32:.0f} tokens/s "
        f"-> {choice}",
        file=sys.stderr,
    )
    return choice


def fail(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(2)


def stage_seconds(times: Path) -> dict[str, float]:
    """The last recorded wall time of each stage in the recipe's stage_times.tsv."""
    out = {}
    for line in times.read_text().splitlines():
        name, seconds, *_ = line.split("\t")
        out[name] = float(seconds)
    return out


def generation_seconds(meta: dict, data: Path) -> tuple[float, float] | None:
    """(seconds of generation the calibration spent, seconds per conversation a full run will
    spend) from prepare-data's meta.json; None for data from before it recorded them."""
    synthesis, regeneration = meta.get("synthesis") or {}, meta.get("regeneration") or {}
    if "seconds" not in synthesis or "seconds" not in regeneration:
        message = f"{data}/meta.json: no generation seconds, the stage's wall time counts"
        print(message, file=sys.stderr)
        return None
    passed = synthesis.get("requests", 0) - sum((synthesis.get("rejected") or {}).values())
    per_prompt = synthesis["seconds"] / max(passed, meta["counts"]["rows"])
    spent = synthesis["seconds"] + regeneration["seconds"]
    return spent, per_prompt + regeneration["seconds"] / meta["counts"]["rows"]


def extraction_seconds(features: Path | None) -> float | None:
    """The calibration's feature shards' own seconds (None: not recorded, or no cache named)."""
    if features is None:
        return None
    files = FeatureCache(features / "train", check_sizes=False).manifest["files"]
    if any("seconds" not in f for f in files):
        print(f"{features}: no extraction seconds, the stage's wall time counts", file=sys.stderr)
        return None
    return float(sum(f["seconds"] for f in files))


def calibration_training(run: Path) -> tuple[float, float]:
    """(steady training tokens/s, the longest probe's seconds) of the calibration's run."""
    metrics = run / "metrics.jsonl"
    train = [r["tokens_per_s"] for r in read_metrics(metrics, "train")][1:]  # after warm-up
    probes = [r["seconds"] for r in read_metrics(metrics, "acceptance")]
    if not train or not probes:
        fail(f"{run}/metrics.jsonl: expected 2+ logged training steps and a probe")
    return statistics.mean(train), max(probes)


def size(args: argparse.Namespace) -> dict[str, float]:
    walls = stage_seconds(args.times)
    meta = read_meta(args.data)
    rows, tokens = meta["counts"]["rows"], meta["counts"]["tokens"]
    generation = generation_seconds(meta, args.data)
    data_work, data_s = walls["calibrate-data"], walls["calibrate-data"] / rows
    if generation is not None:  # prepare-data's own time, without the engine's start
        data_work, data_s = generation
    extraction = extraction_seconds(args.features) or walls["calibrate-features"]
    train_tps, probe_s = calibration_training(args.run)
    per_row = tokens / rows
    data_start = walls["calibrate-data"] - data_work  # imports, model load, engine start
    features_start = walls["calibrate-features"] - extraction  # imports, the target's load
    feature_s = extraction / tokens  # per token
    fixed = data_start + features_start + args.holdout * data_s + args.probes * probe_s + FIXED_S
    per_prompt = data_s + per_row * feature_s + args.epochs * per_row / train_tps
    room = args.minutes * 60 - args.spent - fixed
    prompts = int(room / per_prompt) // GRANULE * GRANULE
    if prompts < MIN_PROMPTS:
        fail(
            f"MINUTES={args.minutes:g}: after {args.spent:.0f} s of calibration this machine has "
            f"room for {max(prompts, 0)} conversations, at least {MIN_PROMPTS} are needed "
            "(raise MINUTES)"
        )
    return {
        "PROMPTS": prompts,
        "EPOCHS": args.epochs,
        "PLANNED_DATA_S": round(data_start + (prompts + args.holdout) * data_s),
        "PLANNED_FEATURES_S": round(features_start + prompts * per_row * feature_s),
        "PLANNED_TRAIN_S": round(
            args.epochs * prompts * per_row / train_tps + args.probes * probe_s
        ),
        "PLANNED_TOTAL_S": round(args.spent + fixed + prompts * per_prompt),
        "CALIBRATION_S": round(args.spent),
        "TRAIN_TOKENS_PER_S": round(train_tps),
    }


def steps(args: argparse.Namespace) -> dict[str, float]:
    """The training steps that fit the time left, at the calibration's tokens per second."""
    train_tps, probe_s = calibration_training(args.run)
    cache = FeatureCache(args.features / "train", check_sizes=False)
    tokens = sum(f["tokens"] for f in cache.manifest["files"])
    per_epoch = cache.num_rows // args.micro_batch_size
    per_step = tokens / per_epoch
    room = args.minutes * 60 - args.spent - args.probes * probe_s - FIXED_S
    fitted = int(room * train_tps / per_step) // QUARTERS * QUARTERS
    floor = max(QUARTERS, per_epoch // QUARTERS * QUARTERS)
    if fitted < floor:
        print(
            f"only {max(fitted, 0)} steps fit: one epoch instead, past the budget", file=sys.stderr
        )
    chosen = max(fitted, floor)
    return {"STEPS": chosen, "PLANNED_FILL_S": round(chosen * per_step / train_tps)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dtype", help="bfloat16 or float32, whichever suits this CPU")
    d.add_argument("target", type=Path, help="the directory holding bf16/ and fp32/")
    s = sub.add_parser("size", help="conversations and epochs that fit the budget")
    s.add_argument("--minutes", type=float, required=True)
    s.add_argument("--spent", type=float, default=0.0, help="seconds of the budget already used")
    s.add_argument("--times", type=Path, required=True, help="the recipe's stage_times.tsv")
    s.add_argument("--data", type=Path, required=True, help="the calibration's prepared data")
    s.add_argument("--features", type=Path, help="the calibration's feature cache")
    s.add_argument("--run", type=Path, required=True, help="the calibration's training run")
    s.add_argument("--epochs", type=int, required=True, help="passes over the conversations")
    s.add_argument("--holdout", type=int, default=32, help="probe prompts written beside them")
    s.add_argument("--probes", type=int, default=4, help="vLLM probes during training")
    t = sub.add_parser("steps", help="training steps that fill the time left")
    t.add_argument("--minutes", type=float, required=True)
    t.add_argument("--spent", type=float, required=True, help="seconds of the budget used")
    t.add_argument("--features", type=Path, required=True, help="the run's feature cache")
    t.add_argument("--run", type=Path, required=True, help="the calibration's training run")
    t.add_argument("--micro-batch-size", type=int, required=True, help="rows per step")
    t.add_argument("--probes", type=int, default=4, help="vLLM probes during training")
    args = p.parse_args()
    if args.command == "dtype":
        print(choose_dtype(args.target))
        return
    try:
        plan = steps(args) if args.command == "steps" else size(args)
    except UserError as err:  # the calibration's data or cache unreadable: one line
        fail(str(err))
    for key, value in plan.items():
        print(f"{key}={value}")
    if args.command == "steps":
        print(
            f"training: {plan['STEPS']} steps fill the {args.minutes:g} minutes after "
            f"{args.spent:.0f} s spent (about {plan['PLANNED_FILL_S']} s)",
            file=sys.stderr,
        )
        return
    print(
        f"plan for {args.minutes:g} minutes: {plan['PROMPTS']} conversations x {args.epochs} "
        f"epochs; data {plan['PLANNED_DATA_S']} s, features {plan['PLANNED_FEATURES_S']} s, "
        f"training {plan['PLANNED_TRAIN_S']} s ({plan['TRAIN_TOKENS_PER_S']} tokens/s, "
        f"{args.probes} probes), calibration {plan['CALIBRATION_S']} s, "
        f"{FIXED_S:.0f} s fixed: {plan['PLANNED_TOTAL_S']} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
