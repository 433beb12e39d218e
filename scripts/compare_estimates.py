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
  python scripts/compare_estimates.py CHECKPOINT DATA --rows 40 --out runs/compare.json \
      [--target PATH] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from eagle_train.checkpoint import load_draft_checkpoint
from eagle_train.data.loader import Batch, PreparedData
from eagle_train.drafts.cycles import finish_cycle_metrics, turn_spans
from eagle_train.drafts.registry import get_draft
from eagle_train.evaluate.offline import chain_lengths, replay_positions
from eagle_train.fsutil import atomic_write_bytes
from eagle_train.target import FrozenTarget
from eagle_train.train_setup import draft_vocab


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


@torch.no_grad()
def run(args: argparse.Namespace) -> dict:
    saved, state, step = load_draft_checkpoint(args.checkpoint)
    spec, cfg = get_draft(saved.draft.algorithm), saved.draft
    dtype = getattr(torch, args.dtype)
    target = FrozenTarget.from_pretrained(args.target or saved.target.path, dtype=dtype)
    vocab = draft_vocab(saved, PreparedData(saved.data.train), target.description.vocab_size)
    draft = spec.build(cfg, target, vocab)
    draft.load_state_dict(state)
    draft.eval()
    k_max = cfg.ttt_steps
    layer_ids = spec.target_layer_ids(cfg, target.description)
    data = PreparedData(args.data)
    rows, trainer_sums = [], {}
    for i in range(min(args.rows, len(data))):
        record = data.rows[i]
        ids = torch.tensor([record["input_ids"]])
        mask = torch.tensor([record["loss_mask"]])
        features = target.features(ids, None, layer_ids)
        proposals = spec.propose(draft, features, ids, cfg, k_max)[0].cpu()
        chains = chain_lengths(proposals, ids[0])
        row = {
            "row": i,
            "off_greedy": off_greedy(features.logits[0], ids[0], mask[0]),
            "slot": slot_counts(proposals, ids[0], mask[0]),
            "cycle": cycle_replay(chains, mask[0], k_max),
        }
        batch = Batch(ids, mask, torch.ones_like(ids), torch.tensor([ids.shape[1]]))
        result = spec.compute_loss(draft, features, batch, cfg)
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
    return {"checkpoint": str(args.checkpoint), "step": step, "data": str(args.data),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, required=True)
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


if __name__ == "__main__":
    raise SystemExit(main())
