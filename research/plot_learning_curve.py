"""The learning curve from one eval-acceptance run: tokens per target step against training size.

    python research/plot_learning_curve.py runs/curve/eval --out runs/curve/learning_curve.png

Each drafter's size is the supervised tokens of the data its run trained on (``size_of``);
runs named ``<curve>-<N>`` form one curve; n-gram and a run with lr 0 are the floors. Prints a
Markdown table (pooled and per-request tokens per target step, per turn, per-position
acceptance, the share of the target's answer tokens in each drafter's vocabulary, the paired difference to the first drafter of the run with its 95% CI) and writes
the PNG.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import safe_open


def size_of(name: str) -> tuple[str, str, int | None]:
    """(curve, label, supervised tokens) of a drafter: a drafter exported into its run
    directory (``RUN/drafter``) trained on the dataset its ``RUN/config.yaml`` names, whose
    meta.json counts the supervised tokens; curve = the run's name up to its last "-".
    Floors (n-gram, and a run trained with lr 0) have no size."""
    if name == "ngram":
        return "n-gram", "n-gram", None
    run = Path(name).parent
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    if float(cfg["optim"]["lr"]) == 0.0:
        return run.name, run.name, None
    meta = json.loads((Path(cfg["data"]["train"]) / "meta.json").read_text())
    return run.name.rsplit("-", 1)[0], run.name, int(meta["token_counts"]["supervised_tokens"])


def vocab_coverage(drafter: Path, outputs: list[list[int]]) -> float | None:
    """Share of the target's own MT-Bench answer tokens that the drafter can propose: in its
    draft vocabulary (target id = draft id + d2t[draft id], as vLLM maps it), or every token
    when it drafts over the whole vocabulary. None for n-gram."""
    weights = drafter / "model.safetensors"
    if not weights.is_file():
        return None
    with safe_open(str(weights), "pt") as f:
        keys = set(f.keys())
        if "d2t" not in keys:
            return 1.0
        d2t = f.get_tensor("d2t")
    vocab = set((torch.arange(len(d2t)) + d2t).tolist())
    tokens = [t for out in outputs for t in out]
    return sum(t in vocab for t in tokens) / len(tokens) if tokens else None


def table(summary: dict[str, Any], eval_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    outputs = [
        r["output"]
        for r in map(json.loads, (eval_dir / "per_prompt.jsonl").read_text().splitlines())
        if r["model"] == "target"
    ]
    paired = {p["b"]: p for p in summary["paired"]}
    first = next(iter(summary["drafters"]))
    lines = [
        f"| drafter | supervised tokens | tokens/target step | per-request mean | turn 1 | turn 2 "
        f"| per-position acceptance | answer tokens in its vocabulary "
        f"| minus {size_of(first)[1]} (95% CI) |",
        "|---|--:|--:|--:|--:|--:|---|--:|---|",
    ]
    points = []
    for name, d in summary["drafters"].items():
        curve, label, tokens = size_of(name)
        o, turns = d["overall"], d["turns"]
        p = paired.get(name)
        diff = f"{p['mean']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]" if p else ""
        rates = " / ".join(f"{r:.3f}" for r in o["per_position_rate"])
        t = [turns.get(k, {}).get("tokens_per_target_step", float("nan")) for k in ("1", "2")]
        cover = vocab_coverage(Path(name), outputs) if name != "ngram" else None
        covered = f"{cover:.3f}" if cover is not None else "-"
        lines.append(
            f"| {label} | {tokens if tokens is not None else '-'} | "
            f"{o['tokens_per_target_step']:.3f} | {o['mean_request_tokens_per_target_step']:.3f} | "
            f"{t[0]:.3f} | {t[1]:.3f} | {rates} | {covered} | {diff} |"
        )
        points.append({"name": name, "curve": curve, "label": label, "tokens": tokens, **o})
    return "\n".join(lines), points


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    curves: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        if p["tokens"] is None:
            ax.axhline(p["tokens_per_target_step"], ls="--", lw=1, color="grey")
            ax.annotate(p["label"], (0.01, p["tokens_per_target_step"]), va="bottom",
                        xycoords=("axes fraction", "data"), fontsize=8)  # fmt: skip
        else:
            curves.setdefault(p["curve"], []).append(p)
    for curve, ps in curves.items():
        ps.sort(key=lambda p: p["tokens"])
        ax.plot([p["tokens"] for p in ps], [p["tokens_per_target_step"] for p in ps],
                marker="o", label=curve)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("supervised training tokens")
    ax.set_ylabel("tokens per target forward step (MT-Bench)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("eval", type=Path, help="an eval-acceptance output directory")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = p.parse_args()
    summary = json.loads((args.eval / "summary.json").read_text())
    text, points = table(summary, args.eval)
    print(text)
    plot(points, args.out)
    print(f"plot -> {args.out}")


if __name__ == "__main__":
    main()
