"""Multi-layer EAGLE-3, EAGLE-3.1 and a draft with its own key/value heads against vLLM's
own drafter class (``llama_eagle3.py``, ``qwen3_eagle3.py``), built from our exported
directory by vLLM's config parsing:

- vLLM's weight loader takes every exported tensor (an unknown name raises there) and fills
  every parameter vLLM's forward uses (all start as NaN);
- our TTT forward's logits at every slot and step equal vLLM's model drafting that slot's
  chain with a KV cache, as its proposer does: step 0 over the prefix, then one token a step
  with the hidden vLLM's forward hands back (pre- or post-norm per ``norm_output``). Only the
  attention kernel is replaced (vLLM's needs a scheduler's metadata): plain causal softmax
  attention over the cached keys, which is what vLLM's kernel computes.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from eagle_train.drafts.eagle3.config import Eagle3Config
from eagle_train.drafts.registry import get_draft
from eagle_train.target_model import FrozenTarget

SPEC = get_draft("eagle3")
STEPS, LENGTH = 3, 7
VARIANTS = {
    "layers2": dict(num_layers=2),
    "eagle31": dict(norm_before_fc=True, fc_norm=True, norm_output=True),
    "layers3-eagle31": dict(num_layers=3, norm_before_fc=True, norm_output=True),
    # a key/value head per query head (the tiny targets share 1 between their 2)
    "mha": dict(num_kv_heads=2),
}
CASES = [("llama", v) for v in VARIANTS] + [("qwen3", "layers3-eagle31"), ("qwen3", "mha")]
pytestmark = pytest.mark.vllm  # vLLM's model classes in-process (no engine): the slow tier


@pytest.fixture(scope="module")
def vllm_parallel():
    """vLLM's (single-rank, gloo) parallel state its layers need; torn down afterwards.
    No engine is started (so this is not a slow ``vllm`` test); skipped without vLLM."""
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        ps.initialize_model_parallel(1, 1)
    yield
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


class CachedCausalAttention(nn.Module):
    """Stands in for vLLM's ``Attention``: (N, h*D) q/k/v of new tokens, keys kept across
    calls; new token i sees every cached key and the new ones up to itself."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n, d = q.shape[0], self.head_dim
        self.keys.append(k.view(n, self.kv_heads, d).transpose(0, 1))
        self.values.append(v.view(n, self.kv_heads, d).transpose(0, 1))
        groups = self.heads // self.kv_heads
        keys = torch.cat(self.keys, 1).repeat_interleave(groups, 0)
        values = torch.cat(self.values, 1).repeat_interleave(groups, 0)
        total = keys.shape[1]
        mask = torch.arange(total)[None, :] <= torch.arange(total - n, total)[:, None]
        out = F.scaled_dot_product_attention(
            q.view(n, self.heads, d).transpose(0, 1), keys, values, attn_mask=mask
        )
        return out.transpose(0, 1).reshape(n, self.heads * d)


def vllm_drafter(drafter: Path, target_path: Path) -> nn.Module:
    """vLLM's EAGLE-3 model class for ``drafter``, its config parsed by vLLM, weights loaded
    by its own loader over NaN-filled parameters, attention swapped for the reference."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import (
        get_model_architecture,
        process_weights_after_loading,
    )

    args = EngineArgs(
        model=str(target_path),
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        speculative_config={"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3},
    )
    vc = args.create_engine_config()
    draft_config = vc.speculative_config.draft_model_config
    model_cls, _ = get_model_architecture(draft_config)
    with set_current_vllm_config(vc):
        model = model_cls(vllm_config=vc)
    for p in model.parameters():
        p.data.fill_(float("nan"))
    model.load_weights(load_file(str(drafter / "model.safetensors")).items())
    with set_current_vllm_config(vc):
        process_weights_after_loading(model, draft_config, torch.device("cpu"))
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.attn = CachedCausalAttention(
            attn.total_num_heads, attn.total_num_kv_heads, attn.head_dim
        )
    return model


def export(draft: nn.Module, cfg: Eagle3Config, target: FrozenTarget, out: Path) -> dict:
    drafter = SPEC.to_vllm(draft.state_dict(), cfg, target.description)
    out.mkdir()
    (out / "config.json").write_text(json.dumps(drafter.config))
    save_file(
        {n: t.contiguous() for n, t in drafter.tensors.items()}, str(out / "model.safetensors")
    )
    return drafter.config


def vllm_chain(model: nn.Module, aux: torch.Tensor, ids: torch.Tensor, t: int) -> torch.Tensor:
    """(STEPS, V) logits vLLM drafts at slot ``t``: its proposer's loop on one request."""
    for layer in model.model.layers:
        layer.self_attn.attn.keys.clear()
        layer.self_attn.attn.values.clear()
    length = ids.shape[0]
    hidden = model.combine_hidden_states(aux[: t + 1])
    tokens, positions = ids[1 : t + 2].clone(), torch.arange(t + 1)
    if len(tokens) < t + 1:  # slot at the end: the last token repeated, as training pads
        tokens = torch.cat([tokens, ids[-1:]])
    out = []
    for k in range(STEPS):
        last, hidden = model(tokens, positions, hidden)
        out.append(model.compute_logits(last[-1:])[0])
        hidden = hidden[-1:]
        tokens = ids[min(t + 2 + k, length - 1)].view(1)
        positions = torch.tensor([t + 1 + k])
    return torch.stack(out)


@pytest.mark.parametrize("family, variant", CASES)
def test_forward_equals_vllm_drafter(
    family: str, variant: str, tiny_world: Path, tmp_path: Path, vllm_parallel: None
) -> None:
    target_path = tiny_world / "targets" / family / "fp32"
    target = FrozenTarget.from_pretrained(target_path, dtype=torch.float32)
    cfg = Eagle3Config(aux_layer_ids=[1, 2, 3], ttt_steps=STEPS, **VARIANTS[variant])
    torch.manual_seed(0)
    draft = SPEC.build(cfg, target, None)
    with torch.no_grad():  # every trained weight non-trivial, norms included
        for p in draft.parameters():
            if p.requires_grad:  # not the embedding: vLLM shares the target's
                p.add_(0.05 * torch.randn_like(p))
    config = export(draft, cfg, target, tmp_path / "drafter")
    assert config["num_hidden_layers"] == cfg.num_layers
    model = vllm_drafter(tmp_path / "drafter", target_path)
    assert len(model.model.layers) == cfg.num_layers
    kv_heads = cfg.num_kv_heads or target.description.num_kv_heads
    assert model.model.layers[0].self_attn.total_num_kv_heads == kv_heads
    assert (model.model.input_norm is not None) == cfg.norm_before_fc
    assert (model.model.fc_norm is not None) == cfg.fc_norm
    assert model.model.norm_output == cfg.norm_output
    # Filled by the loader: everything but the embedding vLLM shares with the target and the
    # hidden_norm vLLM builds in layers >= 1 and never uses.
    unused = {"model.embed_tokens.weight"} | {
        f"model.layers.{i}.hidden_norm.weight" for i in range(1, cfg.num_layers)
    }
    nan = [n for n, p in model.named_parameters() if n not in unused and p.isnan().any()]
    assert nan == []
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(target.embed_tokens().weight)
    ids = torch.randint(
        3, target.config.vocab_size, (1, LENGTH), generator=torch.Generator().manual_seed(1)
    )
    features = target.features(ids, None, SPEC.target_layer_ids(cfg, target.description))
    with torch.no_grad():
        ours = torch.stack(draft(features.aux, ids, STEPS).logits)[:, 0]  # (STEPS, T, V)
        for t in range(LENGTH):
            theirs = vllm_chain(model, features.aux[0], ids[0], t)
            torch.testing.assert_close(ours[:, t], theirs, atol=2e-4, rtol=1e-4)
