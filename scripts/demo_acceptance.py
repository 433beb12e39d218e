"""Acceptance length of an exported drafter in vLLM on held-out demo prompts.

    python scripts/demo_acceptance.py --target runs/demo_world/targets/llama/bf16 \
        --drafter runs/eagle3-llama-demo/drafter --chats runs/demo_world/data/val.jsonl
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--chats", required=True, help="JSONL chats; the first user turn is used")
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    from eagle_train.evaluate.acceptance import chat_prompts, measure_acceptance

    prompts = chat_prompts(args.target, args.chats, args.num_prompts)
    result = measure_acceptance(args.target, args.drafter, prompts, args.max_new_tokens,
                                args.dtype, args.num_speculative_tokens)
    print(result.summary())
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"acceptance_length": result.acceptance_length,
                       "per_position_rate": result.counters.per_position_rate,
                       "drafts": result.counters.drafts, "prompts": len(prompts),
                       "seconds": result.seconds, "baseline_seconds": result.baseline_seconds,
                       "identical_to_baseline": result.identical_to_baseline}, f, indent=2)


if __name__ == "__main__":
    main()
