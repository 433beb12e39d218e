"""One EAGLE-3 training step at the tiny world's shape (random weights), in a process of
its own: prints the peak resident memory of the step above what was held before it (the
draft, its optimizer state and the batch's features loaded; VmHWM reset through
/proc/self/clear_refs, glibc asked to return freed blocks), and the gradients' bytes.

    MALLOC_MMAP_THRESHOLD_=131072 python tests/memory_step_worker.py ROWS TOKENS TTT_STEPS
"""

from __future__ import annotations

import ctypes
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle_train.data.loader import Batch
from eagle_train.drafts.registry import get_draft
from eagle_train.optim import OptimConfig, create_optimizer
from eagle_train.target_model import FrozenTarget, TargetFeatures

# The tiny world's target shape (configs/demo/tiny.yaml)
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=512,
    max_position_embeddings=512,
)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def main(rows: int, tokens: int, ttt_steps: int) -> None:
    torch.manual_seed(0)
    target = FrozenTarget(LlamaForCausalLM(LlamaConfig(**SHAPE)).to(torch.bfloat16))
    spec = get_draft("eagle3")
    cfg = spec.config_cls(aux_layer_ids=[1, 2, 3], ttt_steps=ttt_steps)
    draft = spec.build(cfg, target, None).to(torch.float32)
    optimizer = create_optimizer(draft, OptimConfig(lr=1e-4))
    h, vocab = SHAPE["hidden_size"], SHAPE["vocab_size"]

    def batch_of(n: int, length: int) -> tuple[Batch, TargetFeatures]:
        ids = torch.randint(4, vocab, (n, length))
        ones = torch.ones_like(ids)
        aux = torch.randn(n, length, 3 * h, dtype=torch.bfloat16)
        final = torch.randn(n, length, h, dtype=torch.bfloat16)
        batch = Batch(ids, ones, ones, torch.full((n,), length))
        return batch, TargetFeatures(aux=aux, final=final, head=target.lm_head())

    def step(batch: Batch, features: TargetFeatures) -> None:
        spec.compute_loss(draft, features, batch, cfg).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(*batch_of(1, 16))  # the optimizer's state is allocated here
    batch, features = batch_of(rows, tokens)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    step(batch, features)
    peak = _status("VmHWM") - base
    grads = sum(p.numel() * 4 for p in draft.parameters() if p.requires_grad)
    print(json.dumps({"peak": peak, "gradients": grads}))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
