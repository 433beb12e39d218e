"""Shared pieces of the optimizer tests: grad streams, tiny models, a one-thread fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

# Shapes with a 16-multiple numel (the CPU vector width torch's fused kernel loops over)
# and shapes with a scalar tail, 2-D and 1-D.
BODY_SHAPES = [(64, 48), (4096,), (128,)]
TAIL_SHAPES = [(37,), (4099,), (7, 11)]


@pytest.fixture(autouse=False)
def one_thread() -> Iterator[None]:
    """Run a test on one intra-op thread.

    Why: on the 2-vCPU machines waking the second OpenMP thread costs milliseconds, so a
    1000-step run over small tensors is 100x slower on two threads. Elementwise results do
    not depend on the thread count.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def bf16_values(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(torch.bfloat16)


def grad_stream(
    shapes: list[tuple[int, ...]], steps: int, seed: int = 0
) -> Iterator[list[torch.Tensor]]:
    """``steps`` lists of bf16 gradients whose scale jumps between 1e-6 and 1 per step,
    so moments rise and fall over many binades (where bf16 moments would stall)."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        scale = 10.0 ** float(torch.randint(-6, 1, (1,), generator=gen))
        yield [(torch.randn(s, generator=gen) * scale).to(torch.bfloat16) for s in shapes]


def make_params(
    shapes: list[tuple[int, ...]], dtype: torch.dtype, seed: int = 0
) -> list[nn.Parameter]:
    """bf16-representable starting values, stored in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(bf16_values(s, gen).to(dtype)) for s in shapes]


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in float32 units-in-the-last-place (same-sign values)."""
    ai = a.detach().float().contiguous().view(torch.int32).long()
    bi = b.detach().float().contiguous().view(torch.int32).long()
    return int((ai - bi).abs().max())


class TinyDraft(nn.Module):
    """A draft-like module: embedding, projections with and without bias, norms."""

    def __init__(self, vocab: int = 32, hidden: int = 16, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, dtype=dtype)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False, dtype=dtype)
        self.up = nn.Linear(hidden, 2 * hidden, bias=True, dtype=dtype)
        self.down = nn.Linear(2 * hidden, hidden, bias=False, dtype=dtype)
        self.norm = nn.RMSNorm(hidden, dtype=dtype)
        self.head = nn.Linear(hidden, vocab, bias=False, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.embed(tokens)  # (B, T, H)
        h = self.fc(torch.cat([e, e.roll(1, dims=1)], dim=-1))
        h = h + self.down(torch.nn.functional.silu(self.up(h)))
        return self.head(self.norm(h))  # (B, T, V)


def tiny_loss(model: nn.Module, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 32, (2, 8), generator=gen)
    logits = model(tokens).float()
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 32), tokens[:, 1:].reshape(-1))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
