"""Paired comparison of two drafters on the same prompts (per-prompt differences)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scipy import stats


@dataclass(frozen=True)
class PairedDifference:
    n: int
    mean: float  # mean of (b - a)
    std: float  # sample standard deviation of the differences
    t: float  # paired t statistic
    p_value: float  # two-sided
    ci_low: float  # 95% confidence interval of the mean difference
    ci_high: float


def paired_difference(a: list[float], b: list[float], level: float = 0.95) -> PairedDifference:
    """Student's paired t-test of ``b - a``."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"need two equally long samples of >= 2 values, got {len(a)}, {len(b)}")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    sem = std / math.sqrt(n)
    if sem == 0.0:  # identical differences: no spread, the mean is exact
        t = math.inf if mean else 0.0
        return PairedDifference(n, mean, 0.0, t, 0.0 if mean else 1.0, mean, mean)
    t = mean / sem
    p = 2.0 * stats.t.sf(abs(t), df=n - 1)
    half = stats.t.ppf(0.5 + level / 2.0, df=n - 1) * sem
    return PairedDifference(n, mean, std, t, float(p), mean - half, mean + half)


def paired_summary(a: list[float], b: list[float]) -> dict[str, Any]:
    """The paired statistics of b - a (mean None under two pairs), and on how many pairs b is
    higher (``b_better``) and lower (``b_worse``) than a."""
    out: dict[str, Any] = {"n": len(a), "mean": None}
    if len(a) >= 2:
        out.update(paired_difference(a, b).__dict__)
    out["b_better"] = sum(y > x for x, y in zip(a, b, strict=True))
    out["b_worse"] = sum(y < x for x, y in zip(a, b, strict=True))
    return out


def paired_line(p: dict[str, Any]) -> str:
    if p["mean"] is None:
        return f"{p['n']} request(s): too few to pair"
    return (
        f"mean {p['mean']:+.3f}, t = {p['t']:.2f}, p = {p['p_value']:.3g}, "
        f"95% CI [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]; "
        f"better on {p['b_better']}, worse on {p['b_worse']}"
    )
