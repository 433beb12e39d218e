"""DFlash training step: peak memory and time at long sequences and many anchors, next to
what a dense fp32 (S + N*B)^2 attention score matrix would cost.

One training step = target forward, draft forward over N blocks of B slots, loss, backward,
MasterWeightAdamW step, on random tokens (all supervised, so N anchors are available). Peak
memory: on CUDA torch.cuda.max_memory_allocated, on CPU the process's peak RSS, each minus
the same measure just before the first step (target and draft loaded).

    python benchmarks/bench_dflash.py                  # demo target shape, seq 2048, 512 x 16
    python benchmarks/bench_dflash.py --target runs/demo_world/targets/qwen3/bf16 --device cuda
"""

from __future__ import annotations

import argparse

from benchlib import load_target, measure_steps


def dense_score_bytes(seq: int, anchors: int, block: int, heads: int, layers: int) -> dict:
    """fp32 bytes of one (S + N*B)^2 score matrix per head, and for all heads and layers
    (autograd keeps at least the softmax output of each for backward)."""
    side = seq + anchors * block
    per_head = 4 * side * side
    return {"side": side, "per_head": per_head, "all": per_head * heads * layers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=None, help="HF target dir (default: demo shape)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--anchors", type=int, default=512)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--layer-ids", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    import torch

    from eagle_train.data.loader import Batch
    from eagle_train.drafts.registry import get_draft
    from eagle_train.optim import OptimConfig, create_optimizer

    torch.manual_seed(0)
    device = torch.device(args.device)
    target = load_target(args.target, "qwen3", device, max_positions=args.seq + 64)
    spec = get_draft("dflash")
    cfg = spec.config_cls(
        block_size=args.block,
        num_layers=args.num_layers,
        target_layer_ids=args.layer_ids,
        mask_token_id=3,
        num_anchors=args.anchors,
        loss="hard_ce",  # random rows: no training data to resolve auto from
    )
    draft = spec.build(cfg, target, None).to(device=device, dtype=torch.bfloat16)
    optimizer = create_optimizer(draft, OptimConfig(lr=1e-4))
    ids = torch.randint(4, target.config.vocab_size, (1, args.seq), device=device)
    ones = torch.ones_like(ids)
    batch = Batch(ids, ones, ones, torch.full((1,), args.seq, device=device))
    layer_ids = spec.target_layer_ids(cfg, target.description)

    def step() -> int:
        features = target.features(ids, ones, layer_ids)
        result = spec.compute_loss(draft, features, batch, cfg)
        result.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return result.weight

    blocks, peak, seconds = measure_steps(step, args.steps, device)
    heads = target.config.num_attention_heads
    dense = dense_score_bytes(args.seq, blocks, args.block, heads, args.num_layers)
    print(
        f"seq {args.seq}, {blocks} anchors x block {args.block}, {args.num_layers} draft "
        f"layer(s), {heads} heads, {args.device}"
    )
    print(f"measured: peak +{peak / 2**20:.1f} MiB over the loaded models, {seconds:.2f} s/step")
    print(
        f"training tokens/s: {args.seq / seconds:.0f} sequence tokens, "
        f"{blocks * args.block / seconds:.0f} block slots"
    )
    print(
        f"a dense fp32 ({dense['side']})^2 score matrix: {dense['per_head'] / 2**20:.0f} MiB "
        f"per head, {dense['all'] / 2**30:.2f} GiB for {heads} heads x {args.num_layers} "
        f"layer(s), before the probabilities and their gradient"
    )


if __name__ == "__main__":
    main()
