"""The trainer's per-slot acceptance estimate against vLLM's per-cycle count, on the same tokens.

For one checkpoint and a prepared dataset whose assistant turns are the target's own greedy
answers, every row is run once through the target and the draft (teacher-forced chained
proposals, ``spec.propose``), and three figures are computed on the same chains:

- ``slot``: what training logs as ``sim_accept_len``: 1 + sum_k P(steps 0..k right) over
  every supervised slot (a slot counts for step k when token t+2+k is supervised), and
  ``slot_mean_chain``, 1 + the mean accepted chain over slots whose step 0 is supervised;
- ``cycle``: vLLM's cycles replayed from the start of every assistant turn (all turns; the
  prompt of a later turn is the conversation before it): drafts, accepted per position, AL;
- ``trainer``: the draft's own ``compute_loss`` on the row, its ``sim_accept_len`` and the
  ``cycle_accept_len`` validation now reports (an independent path to the same figures).

Usage:
  python research/compare_estimates.py CHECKPOINT DATA --rows 40 --out runs/compare.json \
      [--target PATH] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle_train.checkpoint import load_draft_checkpoint
from eagle_train.data.loader import Batch, PreparedData
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.cycles import finish_cycle_metrics, turn_spans
from eagle_train.drafts.registry import get_draft
from eagle_train.evaluate.offline import chain_lengths, replay_positions
from eagle_train.fsutil import atomic_write_bytes
from eagle_train.target_model import FrozenTarget, TargetFeatures


def slot_counts(proposals: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """Per step k: supervised slots and those whose steps 0..k are all right (the trainer's
    sim_accept_len terms), plus the chain lengths of step-0-supervised slots."""
    length, k_max = proposals.shape
    right = torch.zeros(length, k_max, dtype=torch.bool)
    valid = torch.zeros(length, k_max, dtype=torch.bool)
    for k in range(k_max):
        n = length - 2 - k
        if n > 0:
            valid[:n, k] = mask[2 + k :].bool()
            right[:n, k] = proposals[:n, k] == ids[2 + k :]
    chain = (right & valid).long().cumprod(-1)
    return {
        "valid": valid.sum(0).tolist(),
        "chain_right": (chain.bool() & valid).sum(0).tolist(),
        "slots": int(valid[:, 0].sum()),
        "chain_sum": int(chain.sum(-1)[valid[:, 0]].sum()),
    }


def off_greedy(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """Supervised tokens that are not the target's argmax here (engine vs this forward's
    near-ties, or a template token after an answer cut at the length limit): the trainer
    compares drafts with the argmax, the replay with the tokens."""
    argmax = logits[:-1].argmax(-1).cpu()
    off = (argmax != ids[1:]) & mask[1:].bool()
    spans = turn_spans(mask, len(mask))
    last = sum(int(off[end - 2]) for _, end in spans)  # the turn's final token
    return {"tokens": int(off.sum()), "at_turn_end": last}


def cycle_replay(chains: torch.Tensor, mask: torch.Tensor, k_max: int) -> dict:
    drafts, accepted = 0, [0] * k_max
    for start, end in turn_spans(mask, len(mask)):
        d, per_position = replay_positions(chains, start, end - start, k_max)
        drafts += d
        accepted = [a + p for a, p in zip(accepted, per_position, strict=True)]
    return {"drafts": drafts, "accepted": accepted}


def figures(slot: dict, cycle: dict) -> dict:
    k_max = len(slot["valid"])
    slot_rate = [r / max(v, 1) for r, v in zip(slot["chain_right"], slot["valid"], strict=True)]
    cycle_rate = [a / max(cycle["drafts"], 1) for a in cycle["accepted"]]
    return {
        "slot_accept_len": 1 + sum(slot_rate),
        "slot_mean_chain": 1 + slot["chain_sum"] / max(slot["slots"], 1),
        "cycle_accept_len": 1 + sum(cycle["accepted"]) / max(cycle["drafts"], 1),
        "slot_rate": slot_rate,
        "cycle_rate": cycle_rate,
        "drafts": cycle["drafts"],
        "slots": slot["slots"],
        "k_max": k_max,
    }


def pool(rows: list[dict], key: str) -> dict:
    """Counts summed over rows (lists element by element)."""
    out: dict = {}
    for row in rows:
        for name, value in row[key].items():
            if name not in out:
                out[name] = list(value) if isinstance(value, list) else value
            elif isinstance(value, list):
                out[name] = [a + b for a, b in zip(out[name], value, strict=True)]
            else:
                out[name] += value
    return out


@dataclass
class TrainedDraft:
    """A checkpoint's draft, built and loaded beside its target, for offline replays."""

    spec: Any
    cfg: Any
    target: FrozenTarget
    draft: torch.nn.Module
    layer_ids: list[int]
    step: int

    def propose(self, features: TargetFeatures, ids: torch.Tensor, steps: int) -> torch.Tensor:
        """(T, steps) chained proposals at every slot of one row (target ids)."""
        return self.spec.propose(self.draft, features, ids, self.cfg, steps)[0].cpu()


def load_trained_draft(checkpoint: Path, target: Path | None, dtype: str) -> TrainedDraft:
    """The draft of ``checkpoint`` with its target (``target`` overrides the saved path). The
    draft vocabulary is the checkpoint's own (``d2t``/``t2d``), so a run on a mixture loads."""
    saved, state, step = load_draft_checkpoint(checkpoint)
    spec, cfg = get_draft(saved.draft.algorithm), saved.draft
    frozen = FrozenTarget.from_pretrained(target or saved.target.path, dtype=getattr(torch, dtype))
    vocab = None
    if "d2t" in state and getattr(cfg, "draft_vocab_size", None) is not None:
        counts = torch.zeros(frozen.description.vocab_size, dtype=torch.long)
        vocab = VocabMapping(d2t=state["d2t"], t2d=state["t2d"], counts=counts)
    draft = spec.build(cfg, frozen, vocab)
    draft.load_state_dict(state)
    draft.eval()
    layer_ids = spec.target_layer_ids(cfg, frozen.description)
    return TrainedDraft(spec, cfg, frozen, draft, layer_ids, step)


@torch.no_grad()
def run(args: argparse.Namespace) -> dict:
    loaded = load_trained_draft(args.checkpoint, args.target, args.dtype)
    k_max = loaded.cfg.ttt_steps
    data = PreparedData(args.data)
    rows, trainer_sums = [], {}
    for i in range(min(args.rows, len(data))):
        record = data.rows[i]
        ids = torch.tensor([record["input_ids"]])
        mask = torch.tensor([record["loss_mask"]])
        features = loaded.target.features(ids, None, loaded.layer_ids)
        proposals = loaded.propose(features, ids, k_max)
        chains = chain_lengths(proposals, ids[0])
        row = {
            "row": i,
            "off_greedy": off_greedy(features.logits[0], ids[0], mask[0]),
            "slot": slot_counts(proposals, ids[0], mask[0]),
            "cycle": cycle_replay(chains, mask[0], k_max),
        }
        batch = Batch(ids, mask, torch.ones_like(ids), torch.tensor([ids.shape[1]]))
        result = loaded.spec.compute_loss(loaded.draft, features, batch, loaded.cfg)
        trainer = finish_cycle_metrics(dict(result.metrics))
        row["trainer"] = {k: trainer[k] for k in ("sim_accept_len", "cycle_accept_len")}
        for k, v in result.metrics.items():  # pooled as validation pools: slot-weighted
            trainer_sums[k] = trainer_sums.get(k, 0.0) + v * result.weight
        trainer_sums["_weight"] = trainer_sums.get("_weight", 0.0) + result.weight
        row.update(figures(row["slot"], row["cycle"]))
        rows.append(row)
    weight = trainer_sums.pop("_weight")
    pooled_trainer = finish_cycle_metrics({k: v / weight for k, v in trainer_sums.items()})
    pooled = figures(pool(rows, "slot"), pool(rows, "cycle"))
    pooled["trainer"] = pooled_trainer
    pooled["off_greedy"] = pool(rows, "off_greedy")
    return {"checkpoint": str(args.checkpoint), "step": loaded.step, "data": str(args.data),
            "rows": rows, "pooled": pooled}  # fmt: skip


def table(report: dict) -> str:
    p = report["pooled"]
    lines = [
        f"{len(report['rows'])} rows, {p['slots']} supervised slots, {p['drafts']} cycles",
        f"{'':28}{'AL':>7}" + "".join(f"{'acc_' + str(k):>8}" for k in range(p["k_max"])),
        f"{'per slot (sim_accept_len)':28}{p['slot_accept_len']:7.3f}"
        + "".join(f"{r:8.3f}" for r in p["slot_rate"]),
        f"{'per cycle (vLLM replay)':28}{p['cycle_accept_len']:7.3f}"
        + "".join(f"{r:8.3f}" for r in p["cycle_rate"]),
        f"{'1 + mean chain per slot':28}{p['slot_mean_chain']:7.3f}",
        f"{'trainer sim_accept_len':28}{p['trainer']['sim_accept_len']:7.3f}",
        f"{'trainer cycle_accept_len':28}{p['trainer'].get('cycle_accept_len', 1.0):7.3f}",
        f"supervised tokens off the target's argmax: {p['off_greedy']['tokens']}"
        f" ({p['off_greedy']['at_turn_end']} of them a turn's last token)",
        f"gap per cycle vs per slot: {p['cycle_accept_len'] / p['slot_accept_len'] - 1:+.1%}",
    ]
    return "\n".join(lines)


def checkpoint_parser(doc: str, rows: int, dtype: str) -> argparse.ArgumentParser:
    """The arguments of the scripts that replay one checkpoint on a prepared dataset."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--dtype", default=dtype, choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, required=True)
    return parser


def run_script(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], dict],
    table: Callable[[dict], str],
) -> int:
    """Parse, refuse a missing input (exit code 2), run, print the table, write the JSON."""
    args = parser.parse_args()
    for path in (args.checkpoint, args.data):
        if not path.exists():
            print(f"{path}: does not exist", file=sys.stderr)
            return 2
    report = run(args)
    print(table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, (json.dumps(report, indent=1) + "\n").encode())
    print(f"wrote {args.out}")
    return 0


def main() -> int:
    return run_script(checkpoint_parser(__doc__ or "", rows=40, dtype="float32"), run, table)


if __name__ == "__main__":
    raise SystemExit(main())
