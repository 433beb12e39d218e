"""Train the same draft twice, differing in one thing, and measure both in ONE
``eval-acceptance`` run: the paired table (tokens per target step each, difference, t, 95%
CI, per category, with AL over drafted steps beside it),
the RMSNorm gains' movement from the checkpoints, and the final losses.

Default: the master-weight experiment, arms ``bf16`` (optim.fp32_master_weights=false: pure
bf16 AdamW) and ``master`` (true: fp32 master weights and moments):

    python research/ab_experiment.py -c configs/train/eagle3-llama-demo.yaml \\
        --out runs/ab/eagle3-master --prompts runs/demo_world/data/val.jsonl --turns 1 \\
        --limit 40 --max-new-tokens 128

Other comparisons name their arms (``NAME:key=value,key=value``) and, to compare two versions
of the code, the checkout an arm trains with (``--arm-code NAME=DIR``, its PYTHONPATH):

    git worktree add /tmp/before HEAD~3
    python research/ab_experiment.py -c ... --arm before: --arm after: \\
        --arm-code before=/tmp/before --out runs/ab/dflash-anchors ...

Each arm trains into OUT/NAME/run with ``--resume auto`` (a rerun continues, a finished run
is not retrained), is exported to OUT/NAME/drafter, and both are evaluated into OUT/eval-A-vs-B
(a finished evaluation is reused unless --reevaluate). The tables go to OUT/paired-A-vs-B.md
and .json. An arm name used again in another comparison under the same
OUT reuses its run. Everything runs through the CLIs.

At a serving temperature (``--temperature 0.8 [--top-p 0.95] [--top-k 50] [--seed 1]``, the
settings of eval-acceptance): the evaluation samples, each request seeded, and both arms
train with the same ``train.acceptance`` settings (validation's ``sim_accept_len_sampled``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ARMS = ["bf16:optim.fp32_master_weights=false", "master:optim.fp32_master_weights=true"]


def parse_arms(specs: list[str]) -> list[tuple[str, list[str]]]:
    arms = []
    for spec in specs:
        name, sep, sets = spec.partition(":")
        if not sep or not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"--arm {spec!r}: expected NAME:key=value[,key=value...]")
        overrides = [s for s in sets.split(",") if s]
        if any("=" not in s for s in overrides):
            raise ValueError(f"--arm {spec!r}: every override must be key=value")
        arms.append((name, overrides))
    if len(arms) != 2 or arms[0][0] == arms[1][0]:
        raise ValueError(f"need exactly two arms with distinct names, got {[a for a, _ in arms]}")
    return arms


def sampling_sets(args: argparse.Namespace) -> list[str]:
    """``key=value`` of the sampling flags given, checked by eval-acceptance's own schema
    before anything trains (top_p/top_k/seed without a temperature are refused)."""
    from pydantic import ValidationError

    from eagle_train.evaluate.settings import Sampling

    given = {
        k: getattr(args, k)
        for k in ("temperature", "top_p", "top_k", "seed")
        if getattr(args, k) is not None
    }
    try:
        Sampling(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "--" + "-".join(str(x) for x in err["loc"]).replace("_", "-") if err["loc"] else ""
        raise ValueError(f"{where or 'sampling'}: {err['msg']}") from None
    return [f"{k}={v}" for k, v in given.items()]


def cli(code: Path, *args: str) -> None:
    # PYTHONSAFEPATH: `python -m` would put the working directory first on sys.path, so a
    # run started in the repository would import its code, not the arm's checkout.
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "PYTHONSAFEPATH": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    cmd = [sys.executable, "-m", "eagle_train.cli", *args]
    print("+", " ".join(cmd), f"(PYTHONPATH={code})", flush=True)
    subprocess.run(cmd, env=env, check=True)


def last_checkpoint(run: Path) -> Path:
    steps = sorted((run / "checkpoints").glob("step-*"))
    if not steps:
        raise FileNotFoundError(f"{run}/checkpoints holds no step-* checkpoint")
    return steps[-1]


def final_metrics(run: Path) -> dict:
    """The last train and validation records of metrics.jsonl."""
    out: dict = {}
    path = run / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("split") in ("train", "val"):
                out[rec["split"]] = rec
    return out


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-c", "--config", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--set", action="append", default=[], help="override for both arms")
    p.add_argument("--arm", action="append", default=None, help="NAME:key=value,... (two)")
    p.add_argument("--arm-code", action="append", default=[], help="NAME=DIR: train with DIR")
    p.add_argument("--target", help="served target (default: the config's target.path)")
    p.add_argument("--prompts", default="mt_bench")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--limit", type=int)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--reevaluate", action="store_true", help="measure a finished pair again")
    p.add_argument("--temperature", type=float, help="sample at this temperature (0: greedy)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int, help="the evaluation's seed (one per request from it)")
    args = p.parse_args()
    try:
        args.sampling = sampling_sets(args)
        arms = parse_arms(args.arm or DEFAULT_ARMS)
        code = {name: REPO for name, _ in arms}
        for spec in args.arm_code:
            name, _, path = spec.partition("=")
            if name not in code or not (Path(path) / "eagle_train").is_dir():
                raise ValueError(f"--arm-code {spec!r}: expected ARM=DIR with DIR/eagle_train")
            code[name] = Path(path).resolve()
        if not args.config.is_file():
            raise ValueError(f"{args.config}: no such config file")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    run_experiment(args, arms, code)


def run_experiment(args: argparse.Namespace, arms: list, code: dict[str, Path]) -> None:
    import yaml
    from ab import norm_gain_stats, paired_table, table_markdown
    from safetensors.torch import load_file

    args.out.mkdir(parents=True, exist_ok=True)
    drafters, info = [], {}
    for name, overrides in arms:
        run = args.out / name / "run"
        sampled = [f"train.acceptance.{s}" for s in args.sampling]
        sets = [*args.set, *sampled, *overrides, f"train.output_dir={run}"]
        cli(
            code[name], "train-draft", "-c", str(args.config), "--resume", "auto",
            *[x for s in sets for x in ("--set", s)],
        )  # fmt: skip
        ckpt = last_checkpoint(run)
        drafter = args.out / name / "drafter"
        cli(REPO, "export-draft", str(ckpt), str(drafter), "--overwrite")
        drafters.append(drafter)
        info[name] = {
            "overrides": overrides,
            "code": str(code[name]),
            "checkpoint": str(ckpt),
            "norm_gains": norm_gain_stats(load_file(str(ckpt / "draft.safetensors"))),
            "final": final_metrics(run),
        }
    target = args.target or yaml.safe_load(args.config.read_text())["target"]["path"]
    for s in args.set:
        if s.startswith("target.path="):
            target = args.target or s.split("=", 1)[1]
    (name_a, _), (name_b, _) = arms
    pair = f"{name_a}-vs-{name_b}"
    eval_dir = args.out / f"eval-{pair}"
    settings = {
        "prompts": args.prompts,
        "turns": args.turns,
        "max_new_tokens": args.max_new_tokens,
        "num_prompts": args.limit,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
    }
    sets = [f"{k}={v}" for k, v in settings.items() if v is not None] + args.sampling
    if (eval_dir / "summary.json").is_file() and not args.reevaluate:
        print(f"{eval_dir}: finished evaluation reused (--reevaluate measures again)")
    else:
        cli(
            REPO, "eval-acceptance", "--target", str(target),
            *[x for d in drafters for x in ("--draft", str(d))],
            "--out", str(eval_dir), *[x for s in sets for x in ("--set", s)],
            *(["--overwrite"] if args.reevaluate else []),
        )  # fmt: skip
    records = [json.loads(x) for x in (eval_dir / "per_prompt.jsonl").read_text().splitlines()]
    rows = paired_table(records, str(drafters[0]), str(drafters[1]))
    lines = [table_markdown(rows, name_a, name_b), "", "| arm | RMSNorm gains moved | max abs"
             " change | final train loss | final val loss |", "|---|---|---|---|---|"]  # fmt: skip
    for name, _ in arms:
        g, fin = info[name]["norm_gains"], info[name]["final"]
        lines.append(
            f"| {name} | {g['moved']} / {g['elements']} | {g['max_abs_change']:.4g} | "
            f"{fin.get('train', {}).get('loss', float('nan')):.4f} | "
            f"{fin.get('val', {}).get('loss', float('nan')):.4f} |"
        )
    text = "\n".join(lines) + "\n"
    write_atomic(args.out / f"paired-{pair}.md", text)
    summary = {"arms": info, "rows": [r.__dict__ for r in rows], "target": str(target)}
    write_atomic(args.out / f"paired-{pair}.json", json.dumps(summary, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
