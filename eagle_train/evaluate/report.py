"""Tables, statistics and the plot of an evaluation run, written beside the raw records."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from eagle_train.evaluate.harness import EvalRun
from eagle_train.evaluate.stats import paired_difference
from eagle_train.fsutil import (
    atomic_directory,
    check_no_overlap,
    check_output_path,
    check_replaceable,
)


def summarize(run: EvalRun) -> dict[str, Any]:
    """Per drafter: per-category and overall AL (1 + accepted/drafts), mean per-request AL,
    per-position acceptance, tokens/s and speedup over the target alone; paired differences
    of every further drafter against the first."""
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in run.records:
        by_model[r["model"]].append(r)
    baseline_tps = _tokens_per_s(by_model["target"]) if by_model["target"] else 0.0
    drafters = {}
    for info in run.drafters:
        rows = by_model[str(info.path)]
        categories = {
            c: _aggregate([r for r in rows if r["category"] == c], baseline_tps)
            for c in sorted({r["category"] for r in rows})
        }
        drafters[str(info.path)] = {
            "method": info.method,
            "num_speculative_tokens": info.num_speculative_tokens,
            "overall": _aggregate(rows, baseline_tps),
            "turns": {
                str(t): _aggregate([r for r in rows if r["turn"] == t], baseline_tps)
                for t in sorted({r["turn"] for r in rows})
            },
            "categories": categories,
            "greedy_equal": _greedy_equal(rows, by_model["target"]),
        }
    summary = {
        "target": str(run.settings.target),
        "prompts": run.settings.prompts,
        "turns": run.settings.turns,
        "baseline_tokens_per_s": baseline_tps,
        "drafters": drafters,
        "paired": _paired(run, by_model),
    }
    return summary


def _greedy_equal(rows: list[dict], target: list[dict]) -> dict[str, int]:
    """How many requests produced exactly the target's own greedy tokens (lossless check)."""
    alone = {(r["id"], r["turn"]): r["output"] for r in target}
    compared = [r for r in rows if (r["id"], r["turn"]) in alone]
    equal = sum(r["output"] == alone[(r["id"], r["turn"])] for r in compared)
    return {"equal": equal, "compared": len(compared)}


def _aggregate(rows: list[dict], baseline_tps: float) -> dict[str, Any]:
    drafts = sum(r["drafts"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    width = max((len(r["accepted_per_pos"]) for r in rows), default=0)
    per_pos = [
        sum(r["accepted_per_pos"][i] for r in rows if i < len(r["accepted_per_pos"]))
        for i in range(width)
    ]
    tps = _tokens_per_s(rows)
    return {
        "requests": len(rows),
        "acceptance_length": 1 + accepted / drafts if drafts else 1.0,
        "mean_request_acceptance_length": sum(r["acceptance_length"] for r in rows) / len(rows),
        "per_position_rate": [a / drafts if drafts else 0.0 for a in per_pos],
        "tokens_per_s": tps,
        "speedup": tps / baseline_tps if baseline_tps else None,
    }


def _tokens_per_s(rows: list[dict]) -> float:
    seconds = sum(r["seconds"] for r in rows)
    return sum(r["new_tokens"] for r in rows) / seconds if seconds else 0.0


def _paired(run: EvalRun, by_model: dict[str, list[dict]]) -> list[dict[str, Any]]:
    if len(run.drafters) < 2:
        return []
    key = lambda r: (r["id"], r["turn"])  # noqa: E731
    base = {key(r): r["acceptance_length"] for r in by_model[str(run.drafters[0].path)]}
    out = []
    for info in run.drafters[1:]:
        rows = by_model[str(info.path)]
        a = [base[key(r)] for r in rows]
        b = [r["acceptance_length"] for r in rows]
        d = paired_difference(a, b)
        out.append({"a": str(run.drafters[0].path), "b": str(info.path), **d.__dict__})
    return out


def to_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# Acceptance length: {summary['target']} ({summary['prompts']}, "
        f"turns {summary['turns']})",
        "",
        f"Target alone: {summary['baseline_tokens_per_s']:.1f} tokens/s",
        "",
    ]
    for name, d in summary["drafters"].items():
        lines += [
            f"## {name} ({d['method']}, K={d['num_speculative_tokens']})",
            "",
            "| category | requests | AL | mean request AL | tokens/s | speedup |",
            "|---|---|---|---|---|---|",
        ]
        turn_rows = (
            [(f"turn {t}", row) for t, row in d["turns"].items()] if len(d["turns"]) > 1 else []
        )
        for cat, row in [*d["categories"].items(), *turn_rows, ("**overall**", d["overall"])]:
            speed = f"{row['speedup']:.2f}x" if row["speedup"] is not None else "-"
            lines.append(
                f"| {cat} | {row['requests']} | {row['acceptance_length']:.3f} | "
                f"{row['mean_request_acceptance_length']:.3f} | "
                f"{row['tokens_per_s']:.1f} | {speed} |"
            )
        rates = ", ".join(f"{r:.3f}" for r in d["overall"]["per_position_rate"])
        same = d["greedy_equal"]
        lines += [
            "",
            f"Per-position acceptance rate: {rates}",
            f"Greedy output identical to the target alone: {same['equal']} of {same['compared']}",
            "",
        ]
    for p in summary["paired"]:
        lines.append(
            f"Paired AL difference ({p['b']} - {p['a']}) over {p['n']} requests: "
            f"mean {p['mean']:+.3f}, t = {p['t']:.2f}, p = {p['p_value']:.3g}, "
            f"95% CI [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]"
        )
    return "\n".join(lines) + "\n"


def check_report_dir(
    out_dir: Path, overwrite: bool, inputs: list[tuple[str, Path]] | None = None
) -> Path:
    """Before any engine starts: ``out_dir`` resolved, refused when it overlaps an input or
    holds anything but an earlier evaluation (which it replaces only with ``overwrite``)."""
    out = check_output_path(out_dir, "--out")
    check_no_overlap(out, "--out", inputs or [])
    check_replaceable(out, "--out", overwrite, is_report_dir, "an evaluation")
    return out


def is_report_dir(path: Path) -> bool:
    """True for a directory ``write_report`` wrote (its summary and per-prompt records)."""
    try:
        summary = json.loads((Path(path) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(summary, dict)
        and {"drafters", "baseline_tokens_per_s"} <= summary.keys()
        and (Path(path) / "per_prompt.jsonl").is_file()
    )


def write_report(run: EvalRun, out_dir: Path, overwrite: bool = False) -> dict[str, Any]:
    """Records, summary (JSON, Markdown) and plot, written together or not at all."""
    check_replaceable(out_dir, "--out", overwrite, is_report_dir, "an evaluation")
    summary = summarize(run)
    with atomic_directory(out_dir) as tmp:
        with open(tmp / "per_prompt.jsonl", "w") as f:
            for r in run.records:
                f.write(json.dumps(r) + "\n")
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (tmp / "summary.md").write_text(to_markdown(summary))
        plot(summary, tmp / "acceptance.png")
    return summary


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(summary["drafters"])
    cats = sorted({c for d in summary["drafters"].values() for c in d["categories"]})
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        d = summary["drafters"][name]
        values = [d["categories"].get(c, {}).get("acceptance_length", 0.0) for c in cats]
        left.bar([x + i * width for x in range(len(cats))], values, width, label=Path(name).name)
        rates = d["overall"]["per_position_rate"]
        right.plot(range(1, len(rates) + 1), rates, marker="o", label=Path(name).name)
    left.set_xticks(
        [x + width * (len(names) - 1) / 2 for x in range(len(cats))], cats, rotation=30, ha="right"
    )
    left.set_ylabel("acceptance length")
    left.set_title("Acceptance length per category")
    width_k = max(
        (len(d["overall"]["per_position_rate"]) for d in summary["drafters"].values()), default=0
    )
    right.set_xticks(range(1, width_k + 1))
    right.set_xlabel("draft position")
    right.set_ylabel("acceptance rate")
    right.set_ylim(0, 1)
    right.set_title("Per-position acceptance rate")
    for ax in (left, right):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
