"""Training memory per token per TTT step (or per block slot) beside the bound the shapes set.

Per algorithm (EAGLE-3 at K=1/3/7 with a draft vocabulary and with the full vocabulary,
P-EAGLE, DFlash, DSpark), per target shape (benchmarks/benchlib.py's SHAPES: random weights) and per
sequence length, one training step (forward, loss, backward, MasterWeightAdamW step) on one
row of random tokens, every token supervised, with random target features (the target
itself is not run: its memory is not the draft's). Each point runs in a fresh subprocess:

- measured: the step's peak above the memory held just before it (draft, optimizer state
  and the batch's features loaded; a warm-up step at 64 tokens allocated the optimizer
  state); on CUDA ``torch.cuda.max_memory_allocated``, on CPU the process's peak RSS
  (``/proc/self/status`` VmHWM, reset through ``/proc/self/clear_refs``, glibc's large
  blocks returned to the system at free);
- gradients: the trainable parameters' gradients (and the loss's fp32 head-weight gradient
  accumulator where the head trains), which a step holds whatever its length: set apart;
- activations = measured - gradients, divided by tokens x K (EAGLE-3), by the sampled
  elements (P-EAGLE) or by the block slots (DFlash, DSpark);
- bound: the tensors backward must keep, from the shapes (``eagle_train.memory_plan``'s
  list for the draft spec's ``activations``: the norms' fp32 inputs, q/k/v and the attention
  output with its log-sum-exp, the MLP's gate, up and product, the loss's head-input
  gradient; the target's features counted once per token), printed as "tensors backward
  keeps", and the train-draft pre-flight's estimate (that list times its measured margin,
  ``activation_bytes``). The marginal figure between two lengths (the fixed transients, such
  as one chunk of the loss, cancel) is the one the 1.5x goal is about. No [tokens,
  vocabulary] term (the loss chunk is apart).

    python benchmarks/bench_memory.py --shape smollm2-135m --seqs 512 1024 2048
    python benchmarks/bench_memory.py --shape llama3-8b --device cuda --seqs 8192 32768 \\
        --cases eagle3-k7-full
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

CASES = [
    "eagle3-k1-dv",
    "eagle3-k3-dv",
    "eagle3-k7-dv",
    "eagle3-k1-full",
    "eagle3-k3-full",
    "eagle3-k7-full",
    "eagle3-k3-full-copy",
    "peagle-k4-full",
    "dflash-b16-full",
    "dspark-b7-full",
]
DRAFT_VOCAB = 32000  # the draft vocabulary of the "-dv" cases (SpecForge's and ours at 8B)
WARMUP_TOKENS = 64


@dataclass(frozen=True)
class Case:
    algorithm: str  # eagle3, peagle, dflash, dspark
    k: int  # TTT steps, parallel depths or block size
    draft_vocab: bool
    copy: bool = False  # EAGLE-3's copy supervision on its first TTT step (weight 0.5)

    @classmethod
    def parse(cls, name: str) -> Case:
        algorithm, k, vocab, *copy = name.split("-")
        return cls(algorithm, int(k[1:]), vocab == "dv", copy == ["copy"])

    @property
    def name(self) -> str:
        vocab = "dv" if self.draft_vocab else "full"
        return f"{self.algorithm}-k{self.k}-{vocab}" + ("-copy" if self.copy else "")


def run_point(args: argparse.Namespace, case: Case, seq: int) -> dict:
    import torch
    from benchlib import SHAPES, load_target

    from eagle_train.data.loader import Batch
    from eagle_train.drafts.registry import get_draft
    from eagle_train.memory_plan import ACTIVATION_MARGIN, activation_bytes
    from eagle_train.optim import OptimConfig, create_optimizer
    from eagle_train.target_model import TargetFeatures

    torch.manual_seed(0)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    shape = SHAPES[args.shape]
    # Four target layers: the draft reads three of them (random features: never run).
    target = load_target(args.shape, "llama", device, max_positions=seq + 64, num_layers=4)
    vocab = shape["vocab_size"]
    spec = get_draft(case.algorithm)
    cfg = spec.config_cls(**draft_settings(spec, case, args.anchors))
    mapping = None
    if case.draft_vocab:
        ids = torch.randperm(vocab)[:DRAFT_VOCAB].sort().values
        mapping = _mapping(ids, vocab)
    draft = spec.build(cfg, target, mapping).to(device=device, dtype=dtype)
    optimizer = create_optimizer(draft, OptimConfig(lr=1e-4))
    layer_ids = spec.target_layer_ids(cfg, target.description)
    h = shape["hidden_size"]

    def batch_of(length: int) -> tuple[Batch, TargetFeatures]:
        ids = torch.randint(4, vocab, (1, length), device=device)
        ones = torch.ones_like(ids)
        batch = Batch(ids, ones, ones, torch.full((1,), length, device=device))
        aux = torch.randn(1, length, len(layer_ids) * h, device=device, dtype=torch.bfloat16)
        final = torch.randn(1, length, h, device=device, dtype=torch.bfloat16)
        return batch, TargetFeatures(aux=aux, final=final, head=target.lm_head())

    def step(batch: Batch, features: TargetFeatures) -> int:
        result = spec.compute_loss(draft, features, batch, cfg)
        result.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return result.weight

    step(*batch_of(WARMUP_TOKENS))  # the optimizer's masters and moments
    batch, features = batch_of(seq)
    meter = PeakMeter(device)
    units = step(batch, features)
    peak = meter.peak()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step(batch, features)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    grads = sum(p.numel() * p.element_size() for p in draft.parameters() if p.requires_grad)
    head = getattr(draft, "lm_head", None)
    if head is not None and head.weight.requires_grad:
        grads += head.weight.numel() * 4  # the chunked loss's fp32 accumulator
    # the pre-flight's estimate of what backward keeps (eagle_train/memory_plan.py)
    plan = spec.activations(cfg, target.description, seq, 1)
    bound = activation_bytes(plan, seq, torch.finfo(dtype).bits // 8)
    if case.algorithm == "eagle3":
        count = seq * case.k  # token-steps (K TTT steps over every token)
    else:
        # DFlash's slot 0 is the anchor; every DSpark slot predicts
        slots = {"dflash": case.k - 1, "dspark": case.k}
        count = units * slots.get(case.algorithm, 1)
    activations = peak - grads
    return {
        "case": case.name,
        "seq": seq,
        "count": count,
        "peak_MiB": peak / 2**20,
        "grads_MiB": grads / 2**20,
        "activations_MiB": activations / 2**20,
        "per_unit_KiB": activations / count / 1024,
        "bound_KiB": bound / count / 1024,
        # the tensors the plan lists, without its measured margin: what backward must keep
        "listed_KiB": bound / ACTIVATION_MARGIN / count / 1024,
        "ratio": activations / bound,
        "step_s": sorted(times)[len(times) // 2] if times else float("nan"),
        "tokens_per_s": seq / sorted(times)[len(times) // 2] if times else float("nan"),
    }


def _mapping(ids, vocab: int):
    import torch

    from eagle_train.data.vocab import VocabMapping

    d2t = ids - torch.arange(len(ids))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return VocabMapping(d2t=d2t, t2d=t2d, counts=t2d.long())


def draft_settings(spec, case: Case, anchors: int) -> dict:
    """The draft config of a case (the fields the installed eagle_train has); ``anchors``
    blocks at most per row (DFlash, DSpark)."""
    fields = spec.config_cls.model_fields
    if case.algorithm == "eagle3":
        copy = {"copy_supervision": 0.5, "copy_steps": 1} if case.copy else {}
        return {"aux_layer_ids": [1, 2, 3], "ttt_steps": case.k, **copy}
    if case.algorithm == "peagle":
        return {
            "aux_layer_ids": [1, 2, 3],
            "parallel_steps": case.k,
            "mask_token_id": 3,
            "num_layers": 1,
            "keep_ratio": 1.0,
            "min_keep_ratio": 1.0,
        }
    soft = {"loss": "forward_kl"} if "loss" in fields else {"loss_target": "distill"}
    return {
        "target_layer_ids": [0, 1, 2],
        "num_layers": 1,
        "block_size": case.k,
        "mask_token_id": 3,
        "num_anchors": anchors,
        **soft,
    }


class PeakMeter:
    """The peak memory of what runs from here on, above what is held now."""

    def __init__(self, device) -> None:
        import torch

        self.device = device
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set size (VmHWM) to the current one
        self.base = _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        return _status_kib("VmHWM") * 1024 - self.base


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def print_slopes(rows: list[dict]) -> None:
    """Per case, the memory one more unit costs between consecutive lengths (the fixed
    transients of a step, such as one chunk of the loss, cancel) beside the bound."""
    print("\nmarginal memory per unit between lengths (KiB), against the bound:")
    for case in dict.fromkeys(r["case"] for r in rows):
        pts = sorted((r for r in rows if r["case"] == case), key=lambda r: r["seq"])
        for a, b in zip(pts, pts[1:], strict=False):
            slope = (b["activations_MiB"] - a["activations_MiB"]) * 1024 / (b["count"] - a["count"])
            listed = b["listed_KiB"]
            print(
                f"  {case:16s} seq {a['seq']}->{b['seq']}: {slope:7.1f} KiB/unit; tensors "
                f"backward keeps {listed:6.1f} (ratio {slope / listed:5.2f}); the pre-flight's "
                f"estimate {b['bound_KiB']:6.1f} (ratio {slope / b['bound_KiB']:5.2f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="smollm2-135m", help="a benchlib.SHAPES entry")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="draft dtype (fp32 on CPU, bf16 on CUDA)")
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the measured one")
    parser.add_argument("--anchors", type=int, default=512, help="DFlash's and DSpark's blocks")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--point", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.point:
        print(json.dumps(run_point(args, Case.parse(args.point[0]), int(args.point[1]))))
        return
    # glibc returns blocks above 128 KiB to the system at free, so RSS follows the tensors
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    rows: list[dict] = []
    failed = 0
    print(
        f"shape {args.shape}, {args.device}, {args.dtype}; per unit: token x TTT step "
        "(EAGLE-3), element (P-EAGLE), block slot (DFlash, DSpark)"
    )
    for seq in args.seqs:
        for name in args.cases:
            out = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--point", name, str(seq)],
                capture_output=True,
                text=True,
                env=env,
            )
            if out.returncode != 0:
                print(f"{name:16s} seq {seq:6d}  failed: {out.stderr.strip().splitlines()[-1]}")
                failed += 1
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"{row['case']:16s} seq {seq:6d}  peak +{row['peak_MiB']:8.1f} MiB "
                f"(grads {row['grads_MiB']:6.1f})  {row['per_unit_KiB']:7.1f} KiB/unit  "
                f"bound {row['bound_KiB']:6.1f}  ratio {row['ratio']:5.2f}  "
                f"{row['tokens_per_s']:7.0f} tok/s",
                flush=True,
            )
    print_slopes(rows)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    if failed:
        sys.exit(f"{failed} point(s) failed")


if __name__ == "__main__":
    main()
