"""The evaluation's plot: tokens per target step per category, per-position acceptance, and
tokens per target step by the context length at which the tokens were drafted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle_train.evaluate.context import bucket_labels


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 4.5))
    names = list(summary["drafters"])
    cats = sorted({c for d in summary["drafters"].values() for c in d["categories"]})
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        d = summary["drafters"][name]
        values = [d["categories"].get(c, {}).get("tokens_per_target_step", 0.0) for c in cats]
        left.bar([x + i * width for x in range(len(cats))], values, width, label=Path(name).name)
        rates = d["overall"]["per_position_rate"]
        middle.plot(range(1, len(rates) + 1), rates, marker="o", label=Path(name).name)
    left.set_xticks(
        [x + width * (len(names) - 1) / 2 for x in range(len(cats))], cats, rotation=30, ha="right"
    )
    left.set_ylabel("tokens per target step")
    left.set_title("Tokens per target forward step per category")
    width_k = max(
        (len(d["overall"]["per_position_rate"]) for d in summary["drafters"].values()), default=0
    )
    middle.set_xticks(range(1, width_k + 1))
    middle.set_xlabel("draft position")
    middle.set_ylabel("acceptance rate")
    middle.set_ylim(0, 1)
    middle.set_title("Per-position acceptance rate")
    _plot_context(right, summary)
    for ax in (left, middle, right):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_context(ax: Any, summary: dict[str, Any]) -> None:
    """Tokens per target step per context bucket, one line per drafter, over the buckets any
    drafter has steps in (in bucket order)."""
    present = {row["bucket"] for d in summary["drafters"].values() for row in d["context"]}
    buckets = [b for b in bucket_labels(summary["context_buckets"]) if b in present]
    for name, d in summary["drafters"].items():
        rows = {row["bucket"]: row for row in d["context"]}
        xs = [i for i, b in enumerate(buckets) if b in rows]
        ys = [rows[buckets[i]]["tokens_per_target_step"] for i in xs]
        ax.plot(xs, ys, marker="o", label=Path(name).name)
    ax.set_xticks(range(len(buckets)), buckets)
    ax.set_xlabel("context length when drafted (tokens)")
    ax.set_ylabel("tokens per target step")
    ax.set_title("Tokens per target step by context length")
