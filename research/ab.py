"""Two drafters measured in one ``eval-acceptance`` run: the paired table per category (tokens
per target step, the metric eval-acceptance ranks by, beside AL over drafted steps), and
how far each draft's RMSNorm gains moved from their initial 1.0.

Used by ``research/ab_experiment.py`` (the master-weight experiment and the before/after
comparisons of a training rule); pure functions of the per-prompt records and state dicts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from eagle_train.evaluate.stats import paired_difference
from eagle_train.evaluate.steps import pooled_tokens_per_step, request_tokens_per_step


@dataclass(frozen=True)
class PairedRow:
    """Tokens per target step (``steps.py``) is what the pair is compared on; AL over
    drafted steps is shown beside it, labelled, for reference."""

    category: str
    n: int  # paired requests (prompt, turn)
    tps_a: float  # tokens per target step, pooled over the category's requests
    tps_b: float
    mean_a: float  # mean per-request tokens per target step: what the difference is a mean of
    mean_b: float
    diff: float  # mean per-request difference b - a (= mean_b - mean_a)
    t: float
    ci_low: float
    ci_high: float
    al_a: float  # AL over drafted steps: 1 + accepted / drafts, pooled
    al_b: float


def _al(rows: list[dict]) -> float:
    drafts = sum(r["drafts"] for r in rows)
    return 1.0 + sum(r["accepted"] for r in rows) / drafts if drafts else 1.0


def paired_table(records: list[dict[str, Any]], a: str, b: str) -> list[PairedRow]:
    """Per category then overall: each drafter's tokens per target step and the paired
    per-request difference (b - a) with its t statistic and 95% CI, and each AL over
    drafted steps. ``a``/``b`` are the records' ``model`` values; a request is paired by
    (id, turn) and must be present for both."""
    by_key: dict[str, dict[tuple, dict]] = {a: {}, b: {}}
    for r in records:
        if r["model"] in by_key:
            by_key[r["model"]][(r["id"], r["turn"])] = r
    keys = sorted(by_key[a].keys() & by_key[b].keys(), key=str)
    missing = (by_key[a].keys() | by_key[b].keys()) - set(keys)
    if missing:
        raise ValueError(
            f"{len(missing)} requests measured for one drafter only, e.g. {min(missing)}"
        )
    groups: dict[str, list[tuple]] = defaultdict(list)
    for k in keys:
        groups[by_key[a][k]["category"]].append(k)
    out = []
    for category, ks in [*sorted(groups.items()), ("overall", keys)]:
        ra, rb = [by_key[a][k] for k in ks], [by_key[b][k] for k in ks]
        xa = [request_tokens_per_step(r) for r in ra]
        xb = [request_tokens_per_step(r) for r in rb]
        if len(ks) >= 2:
            d = paired_difference(xa, xb)
            t, lo, hi, diff = d.t, d.ci_low, d.ci_high, d.mean
        else:
            diff = xb[0] - xa[0]
            t, lo, hi = float("nan"), float("nan"), float("nan")
        mean_a, mean_b = sum(xa) / len(xa), sum(xb) / len(xb)
        pooled = pooled_tokens_per_step(ra), pooled_tokens_per_step(rb)
        out.append(
            PairedRow(category, len(ks), *pooled, mean_a, mean_b, diff, t, lo, hi, _al(ra), _al(rb))
        )
    return out


def table_markdown(rows: list[PairedRow], name_a: str, name_b: str) -> str:
    """Mean per-request tokens per target step of each arm (what the paired difference is a
    mean of), the pooled value (all decoded tokens over all decode steps), then AL over
    drafted steps (1 + all accepted / all drafts)."""
    lines = [
        f"| category | n | mean tokens/step {name_a} | mean tokens/step {name_b} "
        f"| diff ({name_b} - {name_a}) | t | 95% CI | pooled tokens/step {name_a} "
        f"| pooled tokens/step {name_b} | AL over drafted steps {name_a} "
        f"| AL over drafted steps {name_b} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cat = f"**{r.category}**" if r.category == "overall" else r.category
        lines.append(
            f"| {cat} | {r.n} | {r.mean_a:.3f} | {r.mean_b:.3f} | {r.diff:+.3f} | {r.t:.2f} | "
            f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}] | {r.tps_a:.3f} | {r.tps_b:.3f} | "
            f"{r.al_a:.3f} | {r.al_b:.3f} |"
        )
    return "\n".join(lines) + "\n"


def norm_gain_stats(state: dict[str, Tensor], initial: float = 1.0) -> dict[str, Any]:
    """Over every RMSNorm gain (a 1-D ``*norm.weight``): how many elements there are, how
    many differ from ``initial`` (RMSNorm's init), the largest and mean |g - initial|."""
    gains = [
        v.float().flatten()
        for k, v in sorted(state.items())
        if k.endswith("norm.weight") and v.dim() == 1
    ]
    if not gains:
        return {"tensors": 0, "elements": 0, "moved": 0, "max_abs_change": 0.0}
    g = torch.cat(gains)
    change = (g - initial).abs()
    return {
        "tensors": len(gains),
        "elements": int(g.numel()),
        "moved": int((change > 0).sum()),
        "max_abs_change": float(change.max()),
        "mean_abs_change": float(change.mean()),
    }
