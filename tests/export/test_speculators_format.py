"""The vllm-project/speculators export: vLLM's own speculators loader turns it back into the
native drafter config and speculative config, the tensors are the native ones, and served
from the drafter directory alone it measures the acceptance of the native export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from draft_cases import ALGORITHMS, has_field, has_speculators_format
from perfect_drafter import AUX_LAYER_IDS, build_identity_target, build_perfect_eagle3
from safetensors.torch import load_file
from target_families import WIDE_VOCAB, build_family_target

from eagle_train.config import load_config
from eagle_train.drafts.registry import DRAFTS, get_draft
from eagle_train.export import ExportError, export_state, serving_config
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget

REPO = Path(__file__).resolve().parents[2]
MASK = 5  # a token id of the tiny family target's vocabulary
# Whether vLLM reads a speculators-format drafter of each algorithm (the demo configs' target
# layers fit the 4-layer tiny family target).
SPECULATORS = [a for a in ALGORITHMS if has_speculators_format(DRAFTS[a])]
NO_SPECULATORS = [a for a in ALGORITHMS if a not in SPECULATORS]
# EAGLE-3.1's norms before fc: vLLM's "peagle" type reads norm_before_fc at the top level
# only and fc_norm from the layer config ("eagle3" reads all three at the top level).
FUSION_NORMS = ["draft.norm_before_fc=true", "draft.fc_norm=true"]
CASES = [(a, []) for a in SPECULATORS] + [
    ("eagle3", [*FUSION_NORMS, "draft.norm_output=true"]),
    ("peagle", FUSION_NORMS),
]


def run_config(algorithm: str, target: Path, overrides: list[str]) -> RunConfig:
    return load_config(
        RunConfig,
        REPO / "configs" / "train" / f"{algorithm}-llama-demo.yaml",
        [f"target.path={target}", "target.dtype=float32", *overrides],
    )


@pytest.fixture(scope="module")
def llama_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama target of the wide world's 33,024 ids (the exported d2t crosses 32,767)."""
    out = tmp_path_factory.mktemp("t") / "llama"
    return build_family_target("llama", out, None, vocab=WIDE_VOCAB)


def export_both(
    algorithm: str, target: Path, out: Path, extra: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    sets = [f"draft.mask_token_id={MASK}"] if has_field(algorithm, "mask_token_id") else []
    cfg = run_config(algorithm, target, [*sets, *extra])
    spec = get_draft(algorithm)
    torch.manual_seed(0)
    state = spec.build(cfg.draft, FrozenTarget.from_pretrained(target, torch.float32), None)
    state = state.state_dict()
    if "t2d" in state:  # a draft vocabulary smaller than the target's: d2t and t2d ship
        # 256 ids spread over the whole vocabulary, on both sides of 32,767 (as a real
        # target's most frequent tokens are), each with its head row
        ids = torch.linspace(0, len(state["t2d"]) - 1, 256).long()
        state["t2d"] = torch.zeros_like(state["t2d"]).index_fill_(0, ids, True)
        state["d2t"] = ids - torch.arange(256)
        state["lm_head.weight"] = state["lm_head.weight"][ids]
    native = export_state(state, cfg, out / "native", {"step": 0})
    return native, export_state(state, cfg, out / "spec", {"step": 0}, fmt="speculators")


@pytest.mark.vllm
@pytest.mark.parametrize(
    "algorithm, extra", CASES, ids=[a + ("-eagle31" if e else "") for a, e in CASES]
)
def test_vllm_reads_the_native_drafter_back(
    algorithm: str, extra: list[str], llama_target: Path, tmp_path: Path
) -> None:
    """What vLLM's speculators loader builds equals the native config.json: a missing
    norm_before_residual (vLLM's default is true), DFlash layer ids off by one, a lost mask
    token or K would all serve a different drafter than the one trained."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    native_dir, spec_dir = export_both(algorithm, llama_target, tmp_path, tuple(extra))
    native = json.loads((native_dir / "config.json").read_text())
    assert all(native.get(s.split("=")[0].removeprefix("draft.")) is True for s in extra)
    written = json.loads((spec_dir / "config.json").read_text())
    assert written["speculators_config"]["verifier"]["name_or_path"] == str(llama_target)
    loaded = SpeculatorsConfig.extract_transformers_pre_trained_config(
        json.loads(json.dumps(written))
    )
    for key, value in native.items():
        # block_size: for people only (vLLM drafts num_speculative_tokens); the rest are
        # carried by the speculators type and speculative config
        if key in (
            "architectures",
            "dtype",
            "parallel_drafting",
            "block_size",
        ):
            continue
        if key == "mask_token_id" and "pard_token" in loaded:  # P-EAGLE's, renamed
            assert loaded["pard_token"] == value
            continue
        if key == "dflash_config":
            assert {k: loaded[key][k] for k in value} == value
            assert loaded[key]["causal"] is False  # DFlash attends its block both ways
            continue
        assert loaded.get(key) == value, key
    if "dflash_config" in native:  # vLLM's speculators type counts layers from 1
        ids = native["dflash_config"]["target_layer_ids"]
        assert loaded["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in ids]
    serving = json.loads((native_dir / "eagle_train.json").read_text())["serving"]
    assert SpeculatorsConfig.extract_vllm_speculative_config(written) == serving
    native_t, spec_t = (
        load_file(native_dir / "model.safetensors"),
        load_file(spec_dir / "model.safetensors"),
    )
    extra = set(spec_t) - set(native_t)
    assert extra == ({"t2d"} if "d2t" in native_t else set())
    assert all(torch.equal(native_t[n], spec_t[n]) for n in native_t)


@pytest.mark.parametrize("algorithm", NO_SPECULATORS)
def test_no_speculators_format_where_vllm_reads_none(
    algorithm: str, llama_target: Path, tmp_path: Path
) -> None:
    with pytest.raises(ExportError, match="--format vllm"):
        export_both(algorithm, llama_target, tmp_path)
    assert not (tmp_path / "spec").exists()


@pytest.mark.slow
@pytest.mark.vllm
def test_served_from_the_drafter_alone_with_the_native_acceptance(tmp_path: Path) -> None:
    """A perfect-by-construction EAGLE-3 drafter (acceptance K+1 natively) exported in both
    formats: ``LLM(model=SPECULATORS_DIR)`` finds the target and method in the drafter and
    measures the same acceptance, with the target's greedy tokens."""
    from eagle_train.engine import VllmEngine

    k = 3
    target = build_identity_target(tmp_path / "target")
    perfect = build_perfect_eagle3(target, tmp_path / "perfect", k)
    state = load_file(perfect / "model.safetensors")
    cfg = run_config(
        "eagle3", target, [f"draft.aux_layer_ids={AUX_LAYER_IDS}", f"draft.ttt_steps={k}"]
    )
    native = export_state(state, cfg, tmp_path / "native", {"step": 0})
    spec_dir = export_state(state, cfg, tmp_path / "spec", {"step": 0}, fmt="speculators")
    prompts = [[1, 7, 8, 9], [1, 30, 31], [1, 50]]
    sampling = dict(temperature=0.0, max_tokens=24, ignore_eos=True)

    def measure(model: Path, spec: dict | None):
        with VllmEngine(model, dtype="float32", max_model_len=256, speculative_config=spec) as e:
            results = e.generate_one_by_one(prompts, sampling)
        drafts = sum(r.counters.drafts for r in results)
        accepted = sum(r.counters.accepted for r in results)
        return [r.tokens for r in results], 1 + accepted / drafts if drafts else 1.0

    alone, _ = measure(target, None)
    native_tokens, native_al = measure(target, serving_config(native))
    spec_tokens, spec_al = measure(spec_dir, None)
    print(f"acceptance length: native {native_al:.3f}, speculators {spec_al:.3f} (K={k})")
    assert native_tokens == alone and spec_tokens == alone
    assert native_al == pytest.approx(k + 1, abs=0.05)  # the drafter is perfect natively
    assert spec_al == pytest.approx(native_al, abs=1e-9)
