"""Regeneration speed on a real target: prepare-data's own path against the engine's ceiling.

On the same prompts (single-turn conversations; MT-Bench's 160 user turns by default, or an
OpenAI JSONL of records), greedy, the same max_new_tokens:

- pipeline: ``prepare-data``'s regeneration code as shipped (its default engine and
  concurrency settings; ``--set key=value`` changes one of ``regenerate.*``), timed without
  the engine start;
- slices (``--slices B``): what prepare-data did before continuous batching: fixed slices of
  B prompts through ``LLM.generate`` on vLLM's default engine (256 sequences at most) and the
  default KV cache;
- ceiling: the same engine at each ``--concurrency c`` (``max_num_seqs = c``, the KV cache
  sized to hold c of the longest requests, so nothing is preempted), all prompts handed over
  at once (for c = 1 only 4 of them);
- prefill: the target's forward over the pipeline's rows (prompt + answer), as
  ``prepare-features`` runs it (``extract_rows``), tokens/s.

Every figure carries vLLM's own counters (generated tokens, preemptions) and the load
average; answers that differ between paths (by prompt) are counted.

    python benchmarks/bench_regenerate.py /work/cache/smollm2/bf16 --prompts 128 \\
        --max-new-tokens 128 --concurrency 1 16 64 256 --slices 64 --out runs/bench.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COUNTERS = ("vllm:generation_tokens", "vllm:prompt_tokens", "vllm:num_preemptions")


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def engine_counters(llm: Any) -> dict[str, float]:
    out = dict.fromkeys(COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in out:
            out[metric.name] += float(metric.value)
    return out


def measured(llm: Any, run: Any) -> dict[str, Any]:
    """Run ``run()``; its wall time, vLLM's counter deltas and tokens/s."""
    before, load = engine_counters(llm), load_avg()
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    after = engine_counters(llm)
    delta = {k.split(":")[1]: after[k] - before[k] for k in COUNTERS}
    return {
        "seconds": round(seconds, 2),
        **{k: int(v) for k, v in delta.items()},
        "tokens_per_s": round(delta["generation_tokens"] / seconds, 1),
        "load_before": load,
        "load_after": load_avg(),
        "_result": result,
    }


def read_prompts(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Single-turn records ``{"id", "messages"}``: the JSONL's, else MT-Bench's user turns."""
    if args.prompts_file:
        rows = [json.loads(x) for x in Path(args.prompts_file).read_text().splitlines() if x]
        records = [
            {"id": str(r.get("id", i)), "messages": [m for m in r["messages"] if m["role"] != "assistant"][:2]}
            for i, r in enumerate(rows)
        ]  # fmt: skip
    else:
        from eagle_train.evaluate.prompts import load_prompts

        records = [
            {"id": f"{p.id}.{t}", "messages": [{"role": "user", "content": turn}]}
            for t in (0, 1)
            for p in load_prompts()
            for turn in p.turns[t : t + 1]
        ]
    if len(records) < args.prompts:
        raise SystemExit(f"only {len(records)} prompts available, asked for {args.prompts}")
    return records[: args.prompts]


def prompt_ids(tokenizer: Any, records: list[dict[str, Any]]) -> dict[str, list[int]]:
    return {
        r["id"]: tokenizer.apply_chat_template(
            r["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for r in records
    }


def run_pipeline(args: argparse.Namespace, records: list[dict[str, Any]], tmp: Path) -> dict:
    """prepare-data's regeneration (``run_regeneration``) on an already open backend."""
    from transformers import AutoTokenizer

    from eagle_train.config import apply_overrides
    from eagle_train.data import ChatRenderer, PrepareDataConfig
    from eagle_train.data.errors import BadRecordPolicy
    from eagle_train.data.prepare import open_backend, run_regeneration
    from eagle_train.data.records import RecordReader

    inputs = tmp / "prompts.jsonl"
    inputs.write_text("".join(json.dumps(r) + "\n" for r in records))
    raw = {
        "inputs": [str(inputs)],
        "output_dir": str(tmp / "pipeline"),
        "tokenizer": str(args.target),
        "max_length": args.max_model_len,
        "regenerate": {
            "enabled": True,
            "backend": "vllm",
            "max_new_tokens": args.max_new_tokens,
            "dtype": args.dtype,
        },
    }
    cfg = PrepareDataConfig.model_validate(apply_overrides(raw, args.set))
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(args.target)))
    backend = open_backend(cfg, renderer)
    try:
        policy = BadRecordPolicy(cfg.on_bad_record)
        reader = RecordReader([inputs], policy)
        out = measured(
            backend.engine.llm,  # type: ignore[attr-defined]
            lambda: run_regeneration(cfg, renderer, reader, policy, backend),
        )
    finally:
        backend.close()
    report = out.pop("_result")[0]
    answers = {}
    tok = renderer.tokenizer
    for line in report.path.read_text().splitlines():
        row = json.loads(line)
        answers[row["id"]] = row["messages"][-1]["content"]
    out["answers"] = {k: tok.encode(v, add_special_tokens=False) for k, v in answers.items()}
    out["settings"] = cfg.regenerate.model_dump(mode="json", exclude={"model", "output_path"})
    return out


def open_engine(args: argparse.Namespace, **kwargs: Any) -> Any:
    from eagle_train.engine import VllmEngine

    engine = VllmEngine(args.target, dtype=args.dtype, max_model_len=args.max_model_len, **kwargs)
    return engine


def greedy_params(args: argparse.Namespace, tokenizer: Any) -> Any:
    from vllm import SamplingParams

    stops = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, stop_token_ids=stops)


def generate(llm: Any, ids: list[list[int]], params: Any) -> list[list[int]]:
    from vllm import TokensPrompt

    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def run_slices(args: argparse.Namespace, prompts: dict[str, list[int]], tokenizer: Any) -> dict:
    """Fixed slices of ``--slices`` prompts, each waiting for its longest answer."""
    engine = open_engine(args).open()
    keys, params = list(prompts), greedy_params(args, tokenizer)
    size = args.slices

    def run() -> list[list[int]]:
        out: list[list[int]] = []
        for lo in range(0, len(keys), size):
            out += generate(engine.llm, [prompts[k] for k in keys[lo : lo + size]], params)
        return out

    try:
        res = measured(engine.llm, run)
    finally:
        engine.close()
    res["answers"] = dict(zip(keys, res.pop("_result"), strict=True))
    res["slice"] = size
    return res


def run_ceiling(
    args: argparse.Namespace, prompts: dict[str, list[int]], tokenizer: Any, c: int
) -> dict:
    from eagle_train.engine import kv_bytes_per_token

    keys = list(prompts)[: min(len(prompts), max(4, 4 * c))]
    longest = max(len(prompts[k]) for k in keys) + args.max_new_tokens
    block = 128  # vLLM's CPU block size; on GPU 16 (rounding up to 128 only over-provisions)
    per_seq = math.ceil(min(longest, args.max_model_len) / block) * block
    kv = max(
        64 * 2**20,
        int(min(c, len(keys)) * per_seq * kv_bytes_per_token(args.target, args.dtype) * 1.02),
    )
    engine = open_engine(args, kv_cache_memory_bytes=kv, max_num_seqs=c).open()
    try:
        res = measured(
            engine.llm, lambda: generate(engine.llm, [prompts[k] for k in keys], greedy_params(args, tokenizer))
        )  # fmt: skip
    finally:
        engine.close()
    res["answers"] = dict(zip(keys, res.pop("_result"), strict=True))
    res.update(concurrency=c, requests=len(keys), kv_cache_MiB=round(kv / 2**20, 1))
    return res


def run_prefill(args: argparse.Namespace, rows: list[list[int]]) -> dict:
    import torch

    from eagle_train.target_model import FrozenTarget
    from eagle_train.target_model.extract import extract_rows

    target = FrozenTarget.from_pretrained(str(args.target), getattr(torch, args.dtype), "cpu")
    layers = target.config.num_hidden_layers
    layer_ids = [2, layers // 2, layers - 3]  # EAGLE-3's usual three
    load = load_avg()
    start = time.perf_counter()
    extract_rows(target, rows, layer_ids, args.prefill_batch_tokens, torch.device("cpu"))
    seconds = time.perf_counter() - start
    tokens = sum(len(r) for r in rows)
    return {
        "rows": len(rows),
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "load_before": load,
        "load_after": load_avg(),
    }


def differing(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict[str, int]:
    shared = sorted(a.keys() & b.keys())
    return {"compared": len(shared), "differ": sum(a[k] != b[k] for k in shared)}


def strip_stop(ids: list[int], stops: set[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in stops else ids


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("target", type=Path, help="the target model directory (bf16)")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="every path's compute dtype (CPUs without bf16 units run fp32 faster)",
    )
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--prompts-file", type=Path, help="OpenAI JSONL (default: MT-Bench turns)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64, 256])
    p.add_argument("--slices", type=int, default=0, help="also the fixed-slice path (0: skip)")
    p.add_argument("--no-pipeline", action="store_true")
    p.add_argument("--prefill-batch-tokens", type=int, default=16384)
    p.add_argument("--set", action="append", default=[], help="regenerate.KEY=VALUE")
    p.add_argument("--out", type=Path, help="write the figures (and answers) as JSON here")
    args = p.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.target))
    records = read_prompts(args)
    prompts = prompt_ids(tokenizer, records)
    stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    results: dict[str, Any] = {
        "load_start": load_avg(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_pipeline:
            results["pipeline"] = run_pipeline(args, records, Path(tmp))
    if args.slices:
        results["slices"] = run_slices(args, prompts, tokenizer)
    for c in args.concurrency:
        results[f"ceiling@{c}"] = run_ceiling(args, prompts, tokenizer, c)
    answers = {
        name: {k: strip_stop(v, stops) for k, v in r["answers"].items()}
        for name, r in results.items()
        if isinstance(r, dict) and "answers" in r
    }
    source = answers.get("pipeline") or next(iter(answers.values()))
    rows = [prompts[k] + source[k] for k in prompts if k in source]
    results["prefill"] = run_prefill(args, rows)
    names = list(answers)
    results["answers_differ"] = {
        f"{a} vs {b}": differing(answers[a], answers[b])
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }
    results["load_end"] = load_avg()
    ceilings = [r["tokens_per_s"] for k, r in results.items() if k.startswith("ceiling@")]
    print(f"load average at start {results['load_start']}, at end {results['load_end']}")
    for name, r in results.items():
        if isinstance(r, dict) and "tokens_per_s" in r:
            extra = f", {r['preemptions']} preemptions" if "preemptions" in r else ""
            share = (
                f" ({r['tokens_per_s'] / max(ceilings):.0%} of the best ceiling)"
                if ceilings and "answers" in r
                else ""
            )
            print(f"{name:>14}: {r['tokens_per_s']:8.1f} tokens/s in {r['seconds']:.1f}s{extra}{share} [load {r['load_before']} -> {r['load_after']}]")  # fmt: skip
    for pair, d in results["answers_differ"].items():
        print(f"answers differ, {pair}: {d['differ']} of {d['compared']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
