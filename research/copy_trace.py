"""One served request, token by token: does the drafter copy where the text repeats?

For one EAGLE-3 checkpoint and one request of an `eval-acceptance` run (the target-alone
answer, rebuilt as the conversation the target saw: turn 2 includes its turn-1 answer), the
draft runs teacher-forced over the whole conversation and, for every answer token x_{t+2} it
proposes first at slot t, this prints: the token it reads (x_{t+1}), the token wanted, whether
that token is in the draft vocabulary, whether the text went on this way before (a copy match,
``drafts/eagle3/copy_loss.py``), the copy heads' attention mass on the matching keys, and the
rank of the wanted token among the drafter's first-proposal logits (0: proposed). The last line
counts, over the in-vocabulary tokens with a match, how often the heads put most of their
attention on the match and how often the drafter proposes the token then.

    python research/copy_trace.py CHECKPOINT EVAL_DIR QUESTIONS.jsonl QUESTION_ID --turn 2 \
        --target runs/smollm2/fp32
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from compare_estimates import load_trained_draft
from transformers import AutoTokenizer

from eagle_train.drafts.eagle3.copy_loss import copy_log_attention, copy_targets
from eagle_train.drafts.eagle_family import draft_ids
from eagle_train.evaluate.harness import render_turn
from eagle_train.evaluate.prompts import load_prompts
from eagle_train.evaluate.report import read_requests


def conversation(questions: Path, eval_dir: Path, qid: str, turn: int, tok) -> tuple[list, list]:
    """(prompt ids, answer ids) of request ``qid`` turn ``turn`` as the target alone served it:
    eval-acceptance's own prompt parser and rendering, its earlier answers decoded as it does."""
    prompt = next(p for p in load_prompts(questions) if p.id == qid)
    served = read_requests(eval_dir)
    answers = [served[(qid, k)]["target"]["output"] for k in range(1, turn + 1)]
    earlier = [str(tok.decode(a, skip_special_tokens=True)) for a in answers[:-1]]
    return render_turn(tok, prompt, earlier, {}), answers[-1]


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("eval_dir", type=Path)
    ap.add_argument("questions", type=Path)
    ap.add_argument("question_id")
    ap.add_argument("--turn", type=int, default=1)
    ap.add_argument("--target", type=Path, required=True, help="the target model directory")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    loaded = load_trained_draft(args.checkpoint, args.target, args.dtype)
    tok = AutoTokenizer.from_pretrained(args.target)
    prompt, answer = conversation(args.questions, args.eval_dir, args.question_id, args.turn, tok)
    ids = torch.tensor([prompt + answer])
    features = loaded.target.features(ids, None, loaded.layer_ids)
    draft = loaded.draft
    out = draft(features.aux.to(draft.fc.weight.dtype), ids, 1, 1)
    attention = copy_log_attention(out.copy_qk, 0).exp()[0]  # (heads, T, T)
    matches = copy_targets(ids, 0)[0]
    logits = out.logits[0][0]
    to_draft = {int(t): d for d, t in enumerate(draft_ids(draft).tolist())}
    counts = dict.fromkeys(("tokens", "in_vocab", "matched", "peaked", "peaked_right"), 0)
    word = lambda i: repr(tok.decode([int(i)]))  # noqa: E731
    print("reads -> wanted | in vocab | match | heads' mass on match | rank of wanted")
    for t in range(len(prompt) - 1, ids.shape[1] - 2):
        wanted = int(ids[0, t + 2])
        counts["tokens"] += 1
        d = to_draft.get(wanted)
        match = bool(matches[t].any())
        mass = [float((attention[h, t] * matches[t]).sum()) for h in range(len(attention))]
        rank = "-" if d is None else int((logits[t] > logits[t, d]).sum())
        print(
            f"{word(ids[0, t + 1])} -> {word(wanted)} | {'yes' if d is not None else 'no'} | "
            f"{'yes' if match else '-'} | {' '.join(f'{m:.2f}' for m in mass) if match else '-'}"
            f" | {rank}"
        )
        if d is None:
            continue
        counts["in_vocab"] += 1
        if match:
            counts["matched"] += 1
            if min(mass) > 0.5:
                counts["peaked"] += 1
                counts["peaked_right"] += rank == 0
    print(
        f"{counts['tokens']} answer tokens, {counts['in_vocab']} in the draft vocabulary, "
        f"{counts['matched']} of those with a match; the heads put over half their attention "
        f"on it at {counts['peaked']}, and the drafter proposed the token at "
        f"{counts['peaked_right']} of those"
    )


if __name__ == "__main__":
    main()
