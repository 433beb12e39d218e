"""DSpark end to end against vLLM's own DSpark classes: prepare (regenerated) -> train ->
export -> the drafter loaded by vLLM's ``Qwen3DSparkForCausalLM`` and its weight loader ->
greedy speculative decoding of held-out prompts, the drafts made as vLLM's
``DSparkSpeculator`` makes them -> acceptance counted per request and position.

vLLM 0.32's CPU build cannot run a DSpark engine: DSpark is implemented by the V2 model
runner alone ("Model Runner V1 does not support: dspark speculative decoding") and the V2
runner needs Triton, which has no CPU backend here. So the engine step is replayed in process
with vLLM's pieces (docs/algorithms/dspark.md):

- the config is parsed by vLLM (``EngineArgs.create_engine_config``) with only the V1-runner
  refusal of "dspark speculative decoding" lifted, the model class is the one vLLM's registry
  resolves, its weights are loaded by its own ``load_weights`` over NaN-filled parameters;
- the context keys/values come from vLLM's ``precompute_and_store_context_kv`` (its fused
  KV projection, CPU rms_norm and rotary kernels), the block's forward is vLLM's decoder
  with only the attention kernel replaced (vLLM's needs a scheduler's metadata): plain
  softmax attention of the block's queries over [context, block] keys, non-causal;
- the sequential stage is ``DSparkSpeculator._sample_sequential`` for greedy drafting:
  base logits from ``compute_draft_logits``, then left to right ``markov_embed`` of the
  previously DRAFTED token and ``markov_bias``, argmax; the confidence from
  ``compute_confidence`` on the stacked embeddings.

The target's greedy tokens come from a real vLLM engine (the target alone, fp32). Checked:
the replay accepts per request and position exactly what the project's offline estimate
(``spec.propose``, teacher-forced) counts, on every request but at most one near-tie flip;
the trained drafter accepts (AL well above the random-init drafter's); and the confidence
head's estimate beside the observed acceptance per position (printed: the calibration table
of docs/results/2026-12-07-dspark.md).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from run_configs import target_path
from safetensors.torch import load_file
from torch import nn
from vllm_e2e import held_out_prompts, rebuilt_draft, serve, train_and_export

from eagle_train.checkpoint import load_draft_checkpoint
from eagle_train.drafts.cycles import replay_positions
from eagle_train.drafts.dspark.calibration import calibration_table, format_table
from eagle_train.evaluate.offline import estimate_acceptance
from eagle_train.export import serving_config
from eagle_train.target_model import FrozenTarget

pytestmark = pytest.mark.vllm
BLOCK = 7  # configs/train/dspark-*-demo.yaml


@contextmanager
def vllm_parallel() -> Iterator[None]:
    """vLLM's (single-rank, gloo) parallel state its layers need, torn down afterwards. Set
    up after any engine ran: an engine's shutdown destroys the process's parallel state."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        ps.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


# One target family in the suite: each costs an engine run and a vLLM-class replay of every
# cycle (minutes on 2 cores); the Qwen3 target gave the same agreement
# (docs/results/2026-12-07-dspark.md).
@pytest.fixture(scope="module", params=["llama"])
def trained(request: pytest.FixtureRequest, tiny_world: Path, tmp_path_factory) -> dict:
    family = request.param
    root = tmp_path_factory.mktemp(f"dspark-{family}")
    overrides = ["train.max_steps=400", "optim.lr=6e-3", "draft.markov_rank=16"]
    return train_and_export(tiny_world, family, root, "dspark", overrides, dtype="fp32")


class BlockAttention(nn.Module):
    """Stands in for vLLM's ``Attention`` of a DSpark layer: ``do_kv_cache_update`` keeps the
    context keys/values vLLM's precompute writes; a call attends the block's queries over
    [context, block] keys, every query seeing every key (DSpark's layers are non-causal)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.impl = self
        self.kv_cache = None
        self.context: tuple[torch.Tensor, torch.Tensor] | None = None

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        self.context = (key.clone(), value.clone())  # (ctx, kv_heads, D)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self.context is not None
        n, d = q.shape[0], self.head_dim
        keys = torch.cat([self.context[0], k.view(n, self.kv_heads, d)]).transpose(0, 1)
        values = torch.cat([self.context[1], v.view(n, self.kv_heads, d)]).transpose(0, 1)
        groups = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(
            q.view(n, self.heads, d).transpose(0, 1),
            keys.repeat_interleave(groups, 0),
            values.repeat_interleave(groups, 0),
        )
        return out.transpose(0, 1).reshape(n, self.heads * d)


def vllm_dspark(drafter: Path, target_path: Path, target: FrozenTarget, monkeypatch) -> nn.Module:
    """vLLM's DSpark model class for ``drafter``: config parsed by vLLM, weights loaded by
    its loader over NaN, the target's embedding and head shared (as ``load_dspark_model``
    does), attention swapped for ``BlockAttention``."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import (
        get_model_architecture,
        process_weights_after_loading,
    )

    refusals = VllmConfig._get_v1_model_runner_unsupported_features
    monkeypatch.setattr(
        VllmConfig,
        "_get_v1_model_runner_unsupported_features",
        lambda self: [r for r in refusals(self) if r != "dspark speculative decoding"],
    )
    args = EngineArgs(
        model=str(target_path),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        speculative_config=serving_config(drafter),
    )
    vc = args.create_engine_config()
    assert vc.speculative_config.num_speculative_tokens == BLOCK  # read from the export
    draft_config = vc.speculative_config.draft_model_config
    model_cls, _ = get_model_architecture(draft_config)
    assert model_cls.__name__ == "Qwen3DSparkForCausalLM"
    with set_current_vllm_config(vc):
        model = model_cls(vllm_config=vc)
    for p in model.parameters():
        p.data.fill_(float("nan"))
    with set_current_vllm_config(vc):
        model.load_weights(load_file(str(drafter / "model.safetensors")).items())
    shared = {"model.embed_tokens.weight", "lm_head.weight", "model.mask_embedding"}
    assert [n for n, p in model.named_parameters() if n not in shared and p.isnan().any()] == []
    assert model.model.confidence_head is not None and model.draft_id_to_target_id is None
    with torch.no_grad():  # before vLLM's CPU linear methods repack the weights
        model.model.embed_tokens.weight.copy_(target.embed_tokens().weight)
        model.lm_head.weight.copy_(target.lm_head().weight)
    with set_current_vllm_config(vc):
        process_weights_after_loading(model, draft_config, torch.device("cpu"))
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.attn = BlockAttention(attn.num_heads, attn.num_kv_heads, attn.head_dim)
    # the context writes go to the swapped layers (the fused K/V weights load_weights built
    # stay: vLLM's CPU linear repacks qkv_proj.weight afterwards)
    model.model._attn_layers = [layer.self_attn.attn for layer in model.model.layers]
    return model


@torch.no_grad()
def vllm_draft(model: nn.Module, aux: torch.Tensor, seq: torch.Tensor, anchor: int):
    """vLLM's DSpark draft step for the block anchored at ``anchor`` (the last accepted
    token; context = positions before it): (BLOCK drafted ids, their confidences)."""
    inner = model.model
    context = model.combine_hidden_states(aux[:anchor])
    inner.precompute_and_store_context_kv(
        context, torch.arange(anchor), torch.zeros(anchor, dtype=torch.long)
    )
    ids = torch.full((BLOCK,), inner.mask_token_id, dtype=torch.long)
    ids[0] = seq[anchor]
    hidden = model(ids, torch.arange(anchor, anchor + BLOCK))
    base = model.compute_draft_logits(hidden)
    prev, drafted, embeds = seq[anchor].view(1), [], []
    for i in range(BLOCK):  # DSparkSpeculator._sample_sequential, greedy
        embed = model.markov_embed(prev)
        embeds.append(embed)
        token = (base[i : i + 1] + model.markov_bias(embed)).argmax(-1)
        drafted.append(int(model.map_draft_to_target(token)))
        prev = token
    confidence = model.compute_confidence(hidden, torch.cat(embeds))
    return drafted, confidence


def served_counts(model, target, layer_ids, prompts, outputs):
    """(drafts, accepted per position) per request when vLLM's drafter drafts every cycle
    of greedy speculative decoding over the target's own greedy ``outputs``."""
    counts = []
    for prompt, output in zip(prompts, outputs, strict=True):
        seq = torch.tensor(prompt + output)
        aux = target.features(seq[None], None, layer_ids).aux[0]
        chains = torch.zeros(len(seq), dtype=torch.long)
        for slot in range(len(prompt) - 1, len(seq) - 2):
            drafted, _ = vllm_draft(model, aux, seq, slot + 1)
            n = 0
            while n < BLOCK and slot + 2 + n < len(seq) and drafted[n] == int(seq[slot + 2 + n]):
                n += 1
            chains[slot] = n
        counts.append(replay_positions(chains, len(prompt), len(output), BLOCK))
    return counts


def test_vllm_dspark_drafts_what_the_offline_estimate_counts(
    trained: dict, tiny_world: Path, monkeypatch
) -> None:
    family = trained["family"]
    assert serving_config(trained["drafter"]) == {
        "method": "dspark",
        "num_speculative_tokens": BLOCK,
        "model": str(trained["drafter"]),
    }
    config = json.loads((trained["drafter"] / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["block_size"] == BLOCK
    fp32_target = target_path(tiny_world, family, "fp32")
    prompts = held_out_prompts(tiny_world, family)
    outputs, _ = serve(fp32_target, prompts, None)  # the target alone, in a vLLM engine
    target = FrozenTarget.from_pretrained(fp32_target, dtype=torch.float32)
    cfg, state, _ = load_draft_checkpoint(trained["checkpoint"])
    # trained against the fp32 target, the export ships the checkpoint's weights as they are
    shipped = load_file(str(trained["drafter"] / "model.safetensors")).values()
    assert {t.dtype for t in shipped if t.is_floating_point()} == {torch.float32}
    spec, draft = rebuilt_draft(cfg, state, target)
    layer_ids = spec.target_layer_ids(cfg.draft, target.description)
    offline = estimate_acceptance(spec, draft, cfg.draft, target, prompts, outputs, BLOCK)

    with vllm_parallel():
        model = vllm_dspark(trained["drafter"], fp32_target, target, monkeypatch)
        served = served_counts(model, target, layer_ids, prompts, outputs)
        seq = torch.tensor(prompts[0] + outputs[0])
        aux = target.features(seq[None], None, layer_ids).aux[0]
        _, theirs = vllm_draft(model, aux, seq, len(prompts[0]))
    differ = [
        (i, a, b)
        for i, (a, b) in enumerate(zip(offline.per_request, served, strict=True))
        if a != b
    ]
    drafts = sum(d for d, _ in served)
    al = 1 + sum(sum(p) for _, p in served) / drafts
    print(f"dspark-{family}: vLLM-class AL {al:.3f}, offline {offline.acceptance_length:.3f}")
    print(f"dspark-{family}: {len(served) - len(differ)}/{len(served)} requests alike: {differ}")
    assert len(differ) <= 1, differ
    assert al > 1.5  # trained: the comparison is about accepted tokens, not empty chains

    random_state = load_file(str(trained["random"] / "model.safetensors"))
    _, random_draft = rebuilt_draft(cfg, random_state, target)
    rand = estimate_acceptance(spec, random_draft, cfg.draft, target, prompts, outputs, BLOCK)
    assert rand.acceptance_length < al - 0.3, (rand.acceptance_length, al)

    # the confidence head: vLLM's estimate equals ours where the chains agree (an anchor)
    _, conf = spec.block_outputs(
        draft, target.features(seq[None], None, layer_ids), seq[None], BLOCK
    )
    torch.testing.assert_close(theirs[0], conf[0, len(prompts[0]) - 1, 0], rtol=1e-3, atol=1e-3)

    rows = calibration_table(spec, draft, cfg.draft, target, prompts, outputs, BLOCK)
    assert [r.accepted for r in rows] == [
        sum(p[k] for _, p in offline.per_request) for k in range(BLOCK)
    ]
    print(f"dspark-{family} calibration (offline replay, {len(prompts)} prompts):")
    print(format_table(rows))
