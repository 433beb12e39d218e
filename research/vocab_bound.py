"""How far can a draft vocabulary of N tokens go on what the target actually wrote?

    python research/vocab_bound.py EVAL_DIR DATA/token_counts.safetensors --sizes 4096 8192 16384

For each size N, the draft vocabulary train-draft would pick (the N most frequent supervised
ids of the prepared data) against the target-alone answers of an `eval-acceptance` run
(`per_prompt.jsonl`, model "target"; the prefill's token is not drafted, so it is left out):

- coverage: the share of answer tokens in the vocabulary, and of K-token runs wholly in it;
- the vocabulary bound: tokens per target step of a drafter that proposes the target's own
  next tokens, so that it fails only at the first token outside its vocabulary (at most K
  accepted per step, one bonus token per step), pooled and per-request mean;
- for each proposer of the run: on how many requests it beat that bound, i.e. where even a
  perfect drafter with this vocabulary would have lost to it. (Each proposer's run decodes its
  own answer, which bf16 ties can make differ from the target-alone one, so a drafter can
  beat its own bound on a request by chance.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle_train.data import build_vocab_mapping, load_token_counts
from eagle_train.evaluate.report import read_requests
from eagle_train.evaluate.steps import request_tokens_per_step


def bound_steps(answer: list[int], in_vocab: list[bool], k: int) -> int:
    """Target steps a perfect drafter limited to ``in_vocab`` needs for ``answer`` (the tokens
    after the prefill's): each step accepts the next tokens while they are in the vocabulary,
    at most ``k``, then the target adds one."""
    i = steps = 0
    while i < len(answer):
        accepted = 0
        while accepted < k and i + accepted < len(answer) and in_vocab[answer[i + accepted]]:
            accepted += 1
        i += accepted + 1
        steps += 1
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("eval_dir", type=Path)
    ap.add_argument("counts", type=Path, help="the prepared data's token_counts.safetensors")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--k", type=int, default=3, help="draft tokens per step (the eval's K)")
    args = ap.parse_args()

    requests = {key: r for key, r in read_requests(args.eval_dir).items() if "target" in r}
    answers = {key: r["target"]["output"][1:] for key, r in requests.items()}
    proposers = sorted({m for r in requests.values() for m in r} - {"target"})
    counts = load_token_counts(args.counts)
    tokens = sum(len(a) for a in answers.values())
    runs = sum(max(len(a) - args.k + 1, 0) for a in answers.values())
    print(f"{len(requests)} requests, {tokens} answer tokens, K={args.k}")
    print(
        "| draft vocabulary | coverage | K-runs covered | bound pooled | bound per request |"
        + "".join(f" requests {p} beats |" for p in proposers)
    )
    for size in args.sizes:
        in_vocab = build_vocab_mapping(counts, size).t2d.tolist()
        covered = sum(in_vocab[t] for a in answers.values() for t in a)
        whole_runs = sum(
            all(in_vocab[t] for t in a[i : i + args.k])
            for a in answers.values()
            for i in range(len(a) - args.k + 1)
        )
        steps = {key: bound_steps(a, in_vocab, args.k) for key, a in answers.items()}
        bound = {key: len(answers[key]) / s if s else 1.0 for key, s in steps.items()}
        beaten = [
            sum(request_tokens_per_step(r[p]) > bound[key] for key, r in requests.items() if p in r)
            for p in proposers
        ]
        print(
            f"| top {size} | {covered / tokens:.3f} | {whole_runs / max(runs, 1):.3f} | "
            f"{tokens / sum(steps.values()):.3f} | {sum(bound.values()) / len(bound):.3f} |"
            + "".join(f" {b} |" for b in beaten)
        )


if __name__ == "__main__":
    main()
