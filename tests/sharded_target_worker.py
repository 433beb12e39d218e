"""Run under torchrun (2 gloo ranks): the FSDP2-sharded target against the whole one, on
different batches per rank; each rank writes its largest differences to OUT/rank-R.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from eagle_train.target_model import FrozenTarget
from eagle_train.target_model.sharded import load_sharded_target


def main(target: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sharded = load_sharded_target(target, torch.bfloat16, torch.device("cpu"), world)
    whole = FrozenTarget.from_pretrained(target)
    q = sharded.model.get_decoder().layers[0].self_attn.q_proj.weight
    local = q.to_local().numel() / q.numel()  # this rank's part of a layer's weight
    gen = torch.Generator().manual_seed(rank)
    result = {"local_fraction": local, "diffs": []}
    for length in (7, 19):  # ranks run different shapes: the all-gathers are per layer
        ids = torch.randint(0, whole.config.vocab_size, (2, length + rank), generator=gen)
        mask = torch.ones_like(ids)
        mask[1, length // 2 :] = 0
        got = sharded.features(ids, mask, [0, 2, 4])
        want = whole.features(ids, mask, [0, 2, 4])
        result["diffs"].append(
            {
                n: (getattr(got, n) - getattr(want, n)).abs().max().item()
                for n in ("aux", "final", "logits")
            }
        )
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
