"""Make the golden foreign drafters with the other projects' own code (not eagle-train's).

Each is a random-weight drafter (seeded; weights other than 1 everywhere, so a tensor loaded
under the wrong name changes the drafts) for the wide tests' world's Llama target (hidden 64,
4 layers, its vocabulary read from its config: 33,024 ids, its learned pieces above 32,767),
in a layout another tool writes. A draft vocabulary is 128 ids drawn from those the world's
tokenizer produces (not its reserved ones), so it holds ids on both sides of 32,767:

- ``speculators-peagle``, ``speculators-dflash``: ``PEagleDraftModel`` / ``DFlashDraftModel``
  of speculators 0.9.0, ``from_training_args`` + ``save_pretrained`` (what ``speculators
  train`` writes: config.json with ``speculators_config``, model.safetensors with ``d2t`` and
  ``t2d`` where the draft has its own vocabulary; ``speculators-dflash-vocab`` is DFlash with
  a 128-token draft vocabulary: lm_head, d2t, t2d). The speculators EAGLE-3 drafter is
  ``tests/assets/speculators/eagle3-llama-tiny`` (``make_fixture.py`` there).
- ``safeailab-eagle1``: SafeAILab's EAGLE-1 draft (``eagle.model.cnets.Model`` of PyPI's
  eagle-llm 1.2.1) built from a Llama config with ``bias: false``, its state dict saved with
  ``torch.save`` as ``pytorch_model.bin`` (how SafeAILab's EAGLE-1 checkpoints ship).
- ``safeailab-eagle3``: SafeAILab's EAGLE-3 layout, which no PyPI package holds: written from
  the published checkpoints' documented layout (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B:
  ``LlamaForCausalLMEagle3`` config with ``draft_vocab_size``; ``pytorch_model.bin`` with
  ``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``).
- ``zlab-dflash``: z-lab's ``dflash.model.DFlashDraftModel`` (PyPI dflash 0.1.0) from a Qwen3
  config with ``dflash_config`` and ``block_size``, ``save_pretrained``.

Run once, from the repository root, outside the shared environment (the packages go to a
folder of their own; speculators also needs hs-connectors and loguru there):

    python -m pip install --target SITE --no-deps speculators==0.9.0 hs-connectors==0.9.0 \
        loguru==0.7.3 dflash==0.1.0 eagle-llm==1.2.1
    # the tiny demo world, built as tests/assets/speculators/make_fixture.py says
    PYTHONPATH=SITE:$PWD python tests/assets/drafters/make_drafters.py WORLD

Rebuild them whenever the wide tests' world (configs/demo/tiny.yaml with reserved_ids=32512,
wide_world in tests/conftest.py) changes its vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, LlamaConfig, Qwen3Config

OUT = Path(__file__).resolve().parent
DRAFT_VOCAB = 128
VOCAB = 0  # the verifier's vocabulary size, read by main()


def randomize(model: torch.nn.Module, skip: tuple[str, ...] = ()) -> None:
    """Every weight at random (seeded): matrices N(0, 0.2), norms N(1, 0.1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(skip):
                continue
            scale, mean = (0.2, 0.0) if p.dim() > 1 else (0.1, 1.0)
            p.copy_(torch.randn_like(p) * scale + mean)


def produced_ids(verifier: str) -> torch.Tensor:
    """The ids the verifier's tokenizer produces: all but its ``<|reserved_K|>`` pieces."""
    vocab = json.loads((Path(verifier) / "tokenizer.json").read_text())["model"]["vocab"]
    return torch.tensor(sorted(i for p, i in vocab.items() if not p.startswith("<|reserved_")))


def draft_vocab() -> tuple[torch.Tensor, torch.Tensor]:
    produced = produced_ids("targets/llama/fp32")
    ids = torch.sort(produced[torch.randperm(len(produced))[:DRAFT_VOCAB]]).values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(DRAFT_VOCAB), t2d


def fresh(name: str) -> Path:
    out = OUT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return out


def speculators_drafters(verifier: str) -> None:
    from speculators.models.dflash import DFlashDraftModel
    from speculators.models.peagle import PEagleDraftModel

    layer = AutoConfig.from_pretrained(verifier)
    layer.num_hidden_layers = 1
    d2t, t2d = draft_vocab()
    peagle = PEagleDraftModel.from_training_args(
        layer,
        t2d=t2d,
        d2t=d2t,
        draft_vocab_size=DRAFT_VOCAB,
        mask_token_id=VOCAB - 1,
        target_layer_ids=[1, 2, 3],
        num_depths=4,
        verifier_name_or_path=verifier,
        draft_attn_impl="sdpa",
    )
    randomize(peagle, skip=("verifier_",))
    save(peagle, fresh("speculators-peagle"))

    layer = AutoConfig.from_pretrained(verifier)
    layer.num_hidden_layers = 1
    dflash = DFlashDraftModel.from_training_args(
        layer,
        draft_vocab_size=VOCAB,  # the whole vocabulary: no d2t/t2d, lm_head the verifier's
        block_size=4,
        mask_token_id=VOCAB - 1,
        target_layer_ids=[1, 3],
        verifier_name_or_path=verifier,
        draft_attn_impl="sdpa",
    )
    randomize(dflash, skip=("verifier_", "embed_tokens", "lm_head"))
    save(dflash, fresh("speculators-dflash"))


def speculators_dflash_vocab(verifier: str) -> None:
    """speculators' DFlash with a draft vocabulary of its own: lm_head, d2t and t2d ship."""
    from speculators.models.dflash import DFlashDraftModel

    layer = AutoConfig.from_pretrained(verifier)
    layer.num_hidden_layers = 1
    d2t, t2d = draft_vocab()
    dflash = DFlashDraftModel.from_training_args(
        layer,
        t2d=t2d,
        d2t=d2t,
        draft_vocab_size=DRAFT_VOCAB,
        block_size=4,
        mask_token_id=VOCAB - 1,
        target_layer_ids=[1, 3],
        verifier_name_or_path=verifier,
        draft_attn_impl="sdpa",
    )
    randomize(dflash, skip=("verifier_", "embed_tokens"))
    save(dflash, fresh("speculators-dflash-vocab"))


def save(model: torch.nn.Module, out: Path) -> None:
    model.save_pretrained(out)
    # save_pretrained also copies speculators' config class (auto_map, trust_remote_code);
    # neither vLLM nor eagle-train reads it.
    (out / "config.py").unlink(missing_ok=True)


def llama_config(verifier: str, **extra: object) -> LlamaConfig:
    config = LlamaConfig.from_pretrained(verifier)
    config.num_hidden_layers = 1
    for key, value in extra.items():
        setattr(config, key, value)
    return config


def safeailab_eagle1(verifier: str) -> None:
    from eagle.model.cnets import Model

    config = llama_config(verifier, bias=False)
    # eagle-llm 1.2.1 predates transformers 5's rope fields: it reads the old attributes
    old = SimpleNamespace(**{**config.to_dict(), "rope_scaling": None, "rope_theta": 10000.0})
    model = Model(old, bias=False)
    randomize(model)
    out = fresh("safeailab-eagle1")
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("tree_")}
    torch.save(state, out / "pytorch_model.bin")
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)


def safeailab_eagle3(verifier: str) -> None:
    """The documented layout, each tensor shaped as SafeAILab's ``cnets.py`` builds it."""
    config = llama_config(verifier, draft_vocab_size=DRAFT_VOCAB)
    h, inter = config.hidden_size, config.intermediate_size
    head_dim = h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    d2t, t2d = draft_vocab()
    shapes = {
        "fc.weight": (h, 3 * h),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (h, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, h),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "norm.weight": (h,),
        "lm_head.weight": (DRAFT_VOCAB, h),
    }
    state = {
        name: torch.randn(shape) * (0.2 if len(shape) > 1 else 0.1) + (len(shape) == 1)
        for name, shape in shapes.items()
    }
    state.update(d2t=d2t, t2d=t2d)
    out = fresh("safeailab-eagle3")
    torch.save(state, out / "pytorch_model.bin")
    config.architectures = ["LlamaForCausalLMEagle3"]
    config.save_pretrained(out)


def zlab_dflash(verifier: str) -> None:
    from dflash.model import DFlashDraftModel

    target = json.loads((Path(verifier) / "config.json").read_text())
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=target["hidden_size"],
        intermediate_size=target["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=target["num_attention_heads"],
        num_key_value_heads=target["num_key_value_heads"],
        head_dim=target["hidden_size"] // target["num_attention_heads"],
        rms_norm_eps=target["rms_norm_eps"],
        max_position_embeddings=target["max_position_embeddings"],
        tie_word_embeddings=False,
    )
    config.num_target_layers = target["num_hidden_layers"]
    config.block_size = 4
    config.dflash_config = {"mask_token_id": VOCAB - 1, "target_layer_ids": [0, 2]}
    config.architectures = ["DFlashDraftModel"]
    model = DFlashDraftModel(config)
    randomize(model)
    model.save_pretrained(fresh("zlab-dflash"))


def main() -> None:
    world = Path(sys.argv[1]).resolve()
    os.chdir(world)  # the verifier is named by a relative path, as a hub id would be
    verifier = "targets/llama/fp32"
    global VOCAB
    VOCAB = AutoConfig.from_pretrained(verifier).vocab_size
    makers = (
        speculators_drafters,
        safeailab_eagle1,
        safeailab_eagle3,
        zlab_dflash,
        speculators_dflash_vocab,
    )
    for make in makers:
        torch.manual_seed(0)
        make(verifier)
    for out in sorted(OUT.iterdir()):
        if out.is_dir():
            print(out.name, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
