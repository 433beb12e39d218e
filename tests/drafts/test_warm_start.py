"""draft.init_from: a drafter directory in each layout vLLM serves loads into the run's draft
and computes what the exported draft computed; a drafter made by speculators' own code
(tests/assets/speculators, see make_fixture.py there) loads tensor for tensor; mismatches
with the target or the run config are one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO
from draft_cases import has_speculators_format, loss_from_data
from export_cases import loss_of, perturbed_draft
from realistic import vocab_ids, vocab_size
from run_configs import target_path
from safetensors.torch import load_file, save_file

from eagle_train.config import ConfigError, load_config
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.registry import DRAFTS, get_draft
from eagle_train.drafts.warm_start import initial_vocab, warm_start
from eagle_train.export import export_state
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget

FIXTURE = REPO / "tests" / "assets" / "speculators" / "eagle3-llama-tiny"


def layouts(algorithm: str) -> list[str]:
    """Every layout vLLM serves for the algorithm: native; speculators where vLLM reads that
    format for it; SafeAILab's for drafts with a vocabulary of their own (vLLM's EAGLE-3
    loader: midlayer.*, d2t/t2d, in pytorch_model.bin or model.safetensors) and for EAGLE-1
    (vLLM's EAGLE loader: a plain Llama config, layers.0.*, the embedding shipped, in
    pytorch_model.bin)."""
    spec = get_draft(algorithm)
    found = ["vllm"]
    if has_speculators_format(spec):
        found.append("speculators")
    if spec.uses_draft_vocab:
        found += ["safeailab", "safeailab-safetensors"]
    if algorithm == "eagle1":
        found.append("safeailab")
    return found


CASES = [(a, layout) for a in DRAFTS for layout in layouts(a)]


@pytest.fixture(scope="module")
def llama(wide_world: Path) -> FrozenTarget:
    return FrozenTarget.from_pretrained(target_path(wide_world, "llama", "fp32"), torch.float32)


def run_config(algorithm: str, target: FrozenTarget, *overrides: str) -> RunConfig:
    return load_config(
        RunConfig,
        REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml",
        [
            f"target.path={target.model.name_or_path}",
            "target.dtype=float32",  # an fp32 export: the comparison can be exact
            "data.train=unused",
            *(["draft.loss=hard_ce"] if loss_from_data(algorithm) else []),
            *(["draft.draft_vocab_size=null"] if get_draft(algorithm).uses_draft_vocab else []),
            *overrides,
        ],
    )


def vocab_of(size: int, target: FrozenTarget, seed: int) -> VocabMapping:
    """A draft vocabulary of ``size`` ids the target's tokenizer produces (both sides of
    32,767 on the wide world)."""
    ids = vocab_ids(target.model.name_or_path, size, seed)
    vocab = target.config.vocab_size
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return VocabMapping(ids - torch.arange(size), t2d, torch.zeros(vocab, dtype=torch.long))


def to_safeailab(native: Path, out: Path, embed: torch.Tensor | None, safetensors: bool) -> Path:
    """SafeAILab's layout as vLLM's loaders read it, from a native export, written by hand
    from those loaders (no installable package writes it): a Llama config with no head_dim
    (vLLM derives it); for EAGLE-3 the fused layer under ``midlayer.``, ``t2d`` beside ``d2t``
    and SafeAILab's architecture name; for EAGLE-1 the embedding shipped beside the layer."""
    out.mkdir()
    tensors = load_file(str(native / "model.safetensors"))
    config = json.loads((native / "config.json").read_text())
    if "draft_vocab_size" in config:
        renamed = {n.replace("layers.0.", "midlayer."): t for n, t in tensors.items()}
        vd = tensors["lm_head.weight"].shape[0]
        d2t = tensors.get("d2t", torch.zeros(vd, dtype=torch.long))
        t2d = torch.zeros(config["vocab_size"], dtype=torch.bool)
        t2d[torch.arange(vd) + d2t] = True
        renamed["t2d"] = t2d
        config["architectures"] = ["LlamaForCausalLMEagle3"]
        config.pop("num_aux_hidden_states")
    else:  # EAGLE-1
        assert embed is not None
        renamed = {**tensors, "embed_tokens.weight": embed.detach().clone()}
    config.pop("head_dim")
    if safetensors:
        save_file(renamed, str(out / "model.safetensors"))
    else:
        torch.save(renamed, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps(config))
    return out


# Multi-layer EAGLE-3.1 with its own key/value heads (the tiny target shares one between
# its two query heads): its later layers, extra norms and wider k/v travel in every layout.
EAGLE31_2L = (
    "draft.num_layers=2",
    "draft.num_kv_heads=2",
    "draft.norm_before_fc=true",
    "draft.fc_norm=true",
    "draft.norm_output=true",
)
VARIANT_CASES = [("eagle3", layout, EAGLE31_2L) for layout in layouts("eagle3")]


@pytest.mark.parametrize(
    ("algorithm", "layout", "overrides"), [(a, lay, ()) for a, lay in CASES] + VARIANT_CASES
)
def test_export_then_init_from_gives_the_same_loss(
    algorithm: str, layout: str, overrides: tuple[str, ...], llama: FrozenTarget, tmp_path: Path
) -> None:
    spec = get_draft(algorithm)
    cfg = run_config(algorithm, llama, *overrides)
    vocab = vocab_of(96, llama, seed=5) if spec.uses_draft_vocab else None
    trained = perturbed_draft(spec, cfg.draft, llama, 0, vocab)
    shipped_embed = layout == "safeailab" and algorithm == "eagle1"
    if shipped_embed:  # a fine-tuned embedding: the one in the file must be the one used
        with torch.no_grad():
            trained.embed_tokens.weight.add_(0.1 * torch.randn_like(trained.embed_tokens.weight))
    fmt = "speculators" if layout == "speculators" else "vllm"
    out = export_state(trained.state_dict(), cfg, tmp_path / "drafter", {"step": 0}, fmt=fmt)
    (out / "eagle_train.json").unlink()  # a drafter from elsewhere: config.json alone
    if layout.startswith("safeailab"):
        embed = trained.embed_tokens.weight if shipped_embed else None
        out = to_safeailab(out, tmp_path / "safeailab", embed, layout.endswith("safetensors"))

    warm = cfg.draft.model_copy(update={"init_from": out})
    kept = initial_vocab(warm, spec, llama.config.vocab_size)
    if vocab is not None:  # the drafter's own vocabulary is kept
        assert kept is not None and torch.equal(kept.d2t, vocab.d2t)
        assert torch.equal(kept.t2d, vocab.t2d)
    fresh = perturbed_draft(spec, warm, llama, 1, kept)
    expected = loss_of(spec, trained, cfg.draft, llama)
    assert not torch.equal(loss_of(spec, fresh, warm, llama), expected)
    warm_start(warm, spec, fresh, llama.description)
    assert torch.equal(loss_of(spec, fresh, warm, llama), expected)


def eagle3_config(target: FrozenTarget, *overrides: str):
    return run_config("eagle3", target, f"draft.init_from={FIXTURE}", *overrides).draft


def test_a_speculators_drafter_loads_tensor_for_tensor(llama: FrozenTarget, tmp_path: Path) -> None:
    """The fixture was written by speculators' Eagle3DraftModel.save_pretrained: every
    tensor lands under its name, its d2t/t2d become the draft's vocabulary, and
    export-draft writes the same tensors back."""
    spec = get_draft("eagle3")
    cfg = eagle3_config(llama)
    fixture = load_file(str(FIXTURE / "model.safetensors"))
    vocab = initial_vocab(cfg, spec, llama.config.vocab_size)
    assert vocab is not None and torch.equal(vocab.d2t, fixture["d2t"])
    assert torch.equal(vocab.t2d, fixture["t2d"])
    draft = perturbed_draft(spec, cfg, llama, 1, vocab)
    warm_start(cfg, spec, draft, llama.description)
    state = draft.state_dict()
    for name, tensor in fixture.items():
        assert torch.equal(state[name], tensor), name

    run = run_config("eagle3", llama, f"draft.init_from={FIXTURE}")
    out = export_state(state, run, tmp_path / "again", {"step": 0})
    exported = load_file(str(out / "model.safetensors"))
    assert set(exported) == set(fixture) - {"t2d", "embed_tokens.weight"}
    for name, tensor in exported.items():
        assert torch.equal(tensor, fixture[name]), name


def test_another_vocabulary_size_moves_head_rows_by_target_id(llama: FrozenTarget) -> None:
    spec = get_draft("eagle3")
    cfg = eagle3_config(llama, "draft.draft_vocab_size=64")
    assert (
        initial_vocab(cfg, spec, llama.config.vocab_size) is None
    )  # the data's vocabulary is built instead
    vocab = vocab_of(64, llama, seed=9)
    draft = spec.build(cfg, llama, vocab)
    warm_start(cfg, spec, draft, llama.description)

    fixture = load_file(str(FIXTURE / "model.safetensors"))
    theirs = {int(i) + int(fixture["d2t"][i]): i for i in range(128)}  # target id -> row
    head = llama.lm_head().weight
    moved = 0
    for row, target_id in enumerate((torch.arange(64) + vocab.d2t).tolist()):
        if target_id in theirs:
            expected, moved = fixture["lm_head.weight"][theirs[target_id]], moved + 1
        else:  # a fresh row: the target's head row of that token, as in a fresh draft
            expected = head[target_id]
        assert torch.equal(draft.lm_head.weight[row], expected), row
    assert 0 < moved < 64


@pytest.mark.parametrize(
    ("overrides", "algorithm", "needle"),
    [
        (["draft.aux_layer_ids=[0,1,2]"], "eagle3", "eagle_aux_hidden_state_layer_ids"),
        (["draft.qk_norm=true"], "eagle3", "draft.qk_norm"),
        (["draft.num_layers=2"], "eagle3", "num_hidden_layers is 1, this run's draft has 2"),
        (["draft.fc_norm=true"], "eagle3", "set draft.fc_norm"),
        (["draft.norm_output=true"], "eagle3", "set draft.norm_output"),
        (["draft.num_kv_heads=2"], "eagle3", "num_key_value_heads is 1, this run's draft has 2"),
        ([], "dflash", "draft.algorithm is 'dflash'"),
        ([], "peagle", "draft.algorithm is 'peagle'"),
    ],
)
def test_a_mismatch_is_one_line_naming_it(
    overrides: list[str], algorithm: str, needle: str, llama: FrozenTarget
) -> None:
    spec = get_draft(algorithm)
    cfg = run_config(algorithm, llama, f"draft.init_from={FIXTURE}", *overrides).draft
    draft = spec.build(cfg, llama, None)
    with pytest.raises(ConfigError) as err:
        warm_start(cfg, spec, draft, llama.description)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(FIXTURE) in str(err.value)


def test_a_drafter_with_a_layer_no_setting_trains_says_so(
    llama: FrozenTarget, tmp_path: Path
) -> None:
    """norm_before_residual=true (SafeAILab's and speculators' older EAGLE-3 layer) is no
    setting of this version: the refusal says so instead of naming a setting that does not
    exist."""
    other = tmp_path / "other"
    shutil.copytree(FIXTURE, other)
    config = json.loads((other / "config.json").read_text())
    config["norm_before_residual"] = True
    (other / "config.json").write_text(json.dumps(config))
    spec = get_draft("eagle3")
    cfg = run_config("eagle3", llama, f"draft.init_from={other}").draft
    draft = spec.build(cfg, llama, None)
    with pytest.raises(ConfigError) as err:
        warm_start(cfg, spec, draft, llama.description)
    message = str(err.value)
    assert "config norm_before_residual is True, this run's draft has False" in message
    assert "trains only the value vLLM's EAGLE-3 layer has" in message
    assert "draft.norm_before_residual" not in message and "\n" not in message


def test_a_drafter_for_another_target_is_refused(wide_world: Path, tmp_path: Path) -> None:
    """The fixture's vocabulary (the world's) against a target with another one."""
    qwen = FrozenTarget.from_pretrained(target_path(wide_world, "qwen3", "fp32"), torch.float32)
    bad = tmp_path / "bad"
    shutil.copytree(FIXTURE, bad)
    config = json.loads((bad / "config.json").read_text())
    config["transformer_layer_config"]["vocab_size"] = 1000
    (bad / "config.json").write_text(json.dumps(config))
    spec = get_draft("eagle3")
    cfg = run_config("eagle3", qwen, f"draft.init_from={bad}").draft
    vocab = vocab_size(qwen.model.name_or_path)
    with pytest.raises(ConfigError, match=f"vocab_size 1000 != the target's vocab size {vocab}"):
        initial_vocab(cfg, spec, vocab)


def test_train_draft_starts_from_the_drafter(
    wide_world: Path, few_llama_data: Path, tmp_path: Path
) -> None:
    """Through the trainer (not warm_start alone): after one AdamW step (lr 1.5e-3 in
    warmup, no weight decay) every weight of the checkpoint is within that lr of the
    drafter's, so the run trained the drafter; a cold start would be far from it."""
    from train_runs import CONFIG, overrides

    import eagle_train.train as loop

    out = tmp_path / "warm"
    sets = [
        *overrides(wide_world, few_llama_data, out, steps=1),
        f"target.path={target_path(wide_world, 'llama', 'fp32')}",
        "target.dtype=float32",
        "data.val=null",
        "draft.draft_vocab_size=null",  # the drafter's own 128-token vocabulary
        f"draft.init_from={FIXTURE}",
        "train.save_every=1",
        "optim.weight_decay=0",
        "optim.implementation=foreach",
    ]
    loop.train(load_config(RunConfig, CONFIG, sets))
    saved = load_file(str(out / "checkpoints" / "step-0000001" / "draft.safetensors"))
    fixture = load_file(str(FIXTURE / "model.safetensors"))
    assert torch.equal(saved["d2t"], fixture["d2t"])
    lr = 3e-3 * 0.5  # the demo config's lr, first of 2 warmup steps
    for name in set(fixture) & set(saved) - {"d2t", "t2d"}:
        moved = (saved[name].float() - fixture[name].float()).abs().max().item()
        assert moved <= lr * 1.01, (name, moved)
