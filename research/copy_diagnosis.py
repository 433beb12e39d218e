"""Does a drafter continue text the target has already written? Three checks on one checkpoint.

- ``copy``: on every supervised slot of a prepared dataset (the target's own answers), the
  drafter's first proposal against a copy rule that needs no model: the token that followed
  the last earlier occurrence of the same two tokens. Where the rule applies and is right but
  the drafter is wrong, an n-gram proposer gains on the drafter.
- ``ablation``: the drafter's first-proposal accuracy with each fused target layer's features
  set to zero (which layers the draft reads).
- ``spans``: spans of random draft-vocabulary tokens written three times, no template: the
  target's next-token accuracy on the second and third copies (it copies by induction)
  against the drafter's first proposal there.
- ``readout`` (EAGLE-3): per TTT step, teacher-forced as in training, on the supervised slots
  whose next token is in the draft vocabulary: where an earlier place in the row went on the
  same way (a copy match, ``drafts/eagle3/copy_loss.py``), how often the copy heads' mean
  attention peaks on such a place, and how often the drafter's proposal is right when it does
  and when it does not. Right attention with a wrong proposal: the layer reads the place but
  does not turn what it reads into the token.

Usage:
  python research/copy_diagnosis.py CHECKPOINT DATA --rows 80 --out runs/copy.json \
      [--target PATH] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from compare_estimates import TrainedDraft, checkpoint_parser, load_trained_draft, run_script

from eagle_train.data.loader import PreparedData
from eagle_train.drafts.eagle3.copy_loss import copy_log_attention, copy_targets
from eagle_train.drafts.eagle_family import draft_ids, shift_left, valid_slots
from eagle_train.target_model import TargetFeatures


def copy_rule_counts(ids: list[int], mask: list[int], first: list[int]) -> dict[str, int]:
    """``first[t]``: the drafter's proposal for token t+2 at slot t. Counts over the slots
    whose token t+2 is supervised."""
    out = dict.fromkeys(("slots", "drafter", "rule_applies", "rule", "drafter_there"), 0)
    out["rule_only"] = 0
    seen: dict[tuple[int, int], int] = {}
    for t in range(len(ids) - 2):
        if t >= 1:  # known at slot t: (x_{t-1}, x_t) was followed by x_{t+1}
            seen[(ids[t - 1], ids[t])] = ids[t + 1]
        guess = seen.get((ids[t], ids[t + 1]))
        if mask[t + 2]:
            drafter = first[t] == ids[t + 2]
            out["slots"] += 1
            out["drafter"] += drafter
            if guess is not None:
                rule = guess == ids[t + 2]
                out["rule_applies"] += 1
                out["rule"] += rule
                out["drafter_there"] += drafter
                out["rule_only"] += rule and not drafter
    return out


READOUT_KEYS = ("slots", "right", "matched", "right_matched", "on_match", "right_on_match")


def readout_counts(
    attention: torch.Tensor, matches: torch.Tensor, right: torch.Tensor, counted: torch.Tensor
) -> dict[str, int]:
    """One row, one TTT step. ``attention`` (T, T): slot t's attention over keys;
    ``matches`` (T, T) bool: the copy matches; ``right`` and ``counted`` (T,) bool: the
    proposal is right / the slot counts."""
    matched = counted & matches.any(-1)
    on_match = matched & matches.gather(1, attention.argmax(-1, keepdim=True))[:, 0]
    return {
        "slots": int(counted.sum()),
        "right": int((right & counted).sum()),
        "matched": int(matched.sum()),
        "right_matched": int((right & matched).sum()),
        "on_match": int(on_match.sum()),
        "right_on_match": int((right & on_match).sum()),
    }


def copy_readout(
    loaded: TrainedDraft, features: TargetFeatures, ids: torch.Tensor, mask: list[int]
):
    """Per TTT step, ``readout_counts`` of one row (batch of one), teacher-forced."""
    draft, steps = loaded.draft, loaded.cfg.ttt_steps
    out = draft(features.aux.to(draft.fc.weight.dtype), ids, steps, steps)
    loss_mask, lengths = torch.tensor([mask]), torch.tensor([ids.shape[1]])
    to_target = draft_ids(draft).cpu()
    counts = []
    for s in range(steps):
        truth = shift_left(ids, 2 + s)[0]
        counted = valid_slots(loss_mask, lengths, s)[0] & draft.t2d[truth].cpu()
        attention = copy_log_attention(out.copy_qk, s).exp().mean(1)[0].cpu()
        right = to_target[out.logits[s][0].argmax(-1).cpu()] == truth
        counts.append(readout_counts(attention, copy_targets(ids, s)[0].cpu(), right, counted))
    return counts


def first_proposals(loaded: TrainedDraft, features: TargetFeatures, ids: torch.Tensor):
    """(T,) the drafter's first proposal at every slot of one row."""
    return loaded.propose(features, ids, 1)[:, 0]


@torch.no_grad()
def run(args: argparse.Namespace) -> dict:
    loaded = load_trained_draft(args.checkpoint, args.target, args.dtype)
    data = PreparedData(args.data)
    rows = min(args.rows, len(data))
    copy = copy_rule_counts([], [], [])  # zeros
    ablation = {name: [0, 0] for name in ["none", *map(str, loaded.layer_ids)]}
    readout = None
    if loaded.spec.name == "eagle3":
        readout = [dict.fromkeys(READOUT_KEYS, 0) for _ in range(loaded.cfg.ttt_steps)]
    for i in range(rows):
        record = data.rows[i]
        ids = torch.tensor([record["input_ids"]])
        features = loaded.target.features(ids, None, loaded.layer_ids)
        first = first_proposals(loaded, features, ids)
        counts = copy_rule_counts(record["input_ids"], record["loss_mask"], first.tolist())
        copy = {k: copy[k] + v for k, v in counts.items()}
        if readout is not None:
            for total, row in zip(
                readout, copy_readout(loaded, features, ids, record["loss_mask"]), strict=True
            ):
                for k, v in row.items():
                    total[k] += v
        width = features.aux.shape[-1] // len(loaded.layer_ids)
        supervised = torch.tensor(record["loss_mask"][2:]).bool()
        for j, name in enumerate(ablation):
            proposal = first
            if j:
                aux = features.aux.clone()
                aux[..., (j - 1) * width : j * width] = 0
                proposal = first_proposals(loaded, replace(features, aux=aux), ids)
            ablation[name][0] += int(((proposal[:-2] == ids[0, 2:]) & supervised).sum())
            ablation[name][1] += int(supervised.sum())
    return {
        "checkpoint": str(args.checkpoint),
        "step": loaded.step,
        "data": str(args.data),
        "rows": rows,
        "copy": copy,
        "ablation": {k: right / max(n, 1) for k, (right, n) in ablation.items()},
        "spans": repeated_spans(loaded, args.spans, args.span_length),
        "readout": readout,
    }


def repeated_spans(loaded: TrainedDraft, count: int, length: int) -> dict[str, float]:
    """Random spans of draft-vocabulary tokens, each written three times: accuracy on the
    second and third copies, the target's next token against the drafter's first proposal."""
    if hasattr(loaded.draft, "d2t"):
        pool = draft_ids(loaded.draft)
    else:
        pool = torch.arange(loaded.target.description.vocab_size)
    gen = torch.Generator().manual_seed(0)
    target_right = drafter_right = slots = 0
    for _ in range(count):
        ids = pool[torch.randint(len(pool), (length,), generator=gen)].repeat(3)[None]
        features = loaded.target.features(ids, None, loaded.layer_ids)
        first = first_proposals(loaded, features, ids)
        target_next = features.logits[0].argmax(-1).cpu()  # at slot t+1: token t+2
        for t in range(length, ids.shape[1] - 2):
            target_right += int(target_next[t + 1] == ids[0, t + 2])
            drafter_right += int(first[t] == ids[0, t + 2])
            slots += 1
    return {"slots": slots, "target": target_right / slots, "drafter": drafter_right / slots}


def readout_line(step: int, r: dict[str, int]) -> str:
    def share(right: int, of: int) -> str:
        return f"{right / max(of, 1):.3f}"

    elsewhere = r["matched"] - r["on_match"]
    return (
        f"step {step} (teacher-forced, next token in the draft vocabulary, {r['slots']} slots): "
        f"right {share(r['right'], r['slots'])}; a copy match at "
        f"{share(r['matched'], r['slots'])}, right there "
        f"{share(r['right_matched'], r['matched'])}; the copy heads peak on a match at "
        f"{share(r['on_match'], r['matched'])} of those, right then "
        f"{share(r['right_on_match'], r['on_match'])}, right otherwise "
        f"{share(r['right_matched'] - r['right_on_match'], elsewhere)}"
    )


def table(report: dict) -> str:
    c, s = report["copy"], report["spans"]
    n, applies = max(c["slots"], 1), max(c["rule_applies"], 1)
    ablation = ", ".join(
        f"{'all layers' if k == 'none' else 'layer ' + k + ' zeroed'} {v:.3f}"
        for k, v in report["ablation"].items()
    )
    lines = [readout_line(step, r) for step, r in enumerate(report.get("readout") or [])]
    return "\n".join(
        [
            f"{report['rows']} rows, {c['slots']} supervised slots",
            f"drafter's first proposal right: {c['drafter'] / n:.3f}",
            f"copy rule applies at {c['rule_applies'] / n:.3f} of slots; there the rule is right "
            f"{c['rule'] / applies:.3f}, the drafter {c['drafter_there'] / applies:.3f}",
            f"rule right and drafter wrong: {c['rule_only'] / n:.3f} of all slots",
            f"first-proposal accuracy: {ablation}",
            f"random spans written 3 times ({s['slots']} slots): target {s['target']:.3f}, "
            f"drafter {s['drafter']:.3f}",
            *lines,
        ]
    )


def main() -> int:
    parser = checkpoint_parser(__doc__ or "", rows=80, dtype="bfloat16")
    parser.add_argument("--spans", type=int, default=10)
    parser.add_argument("--span-length", type=int, default=40)
    return run_script(parser, run, table)


if __name__ == "__main__":
    raise SystemExit(main())
