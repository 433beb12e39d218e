"""export-draft: validated against vLLM's contract before writing, atomic, with provenance;
the config for the demo targets matches the checked-in golden files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from draft_cases import ALGORITHMS, has_field
from run_configs import run_config
from safetensors.torch import load_file
from transformers import LlamaForCausalLM, Qwen3ForCausalLM
from typer.testing import CliRunner

from eagle_train.cli import export_draft_app
from eagle_train.config import load_config
from eagle_train.data.vocab import build_vocab_mapping
from eagle_train.demo.build import DemoConfig
from eagle_train.demo.targets import target_config
from eagle_train.drafts.registry import get_draft
from eagle_train.export import ExportError, export_state, validate_drafter
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "export" / "golden"


def demo_target(family: str) -> FrozenTarget:
    """The default demo target's architecture (random weights: only shapes matter here)."""
    shape = load_config(DemoConfig, REPO / "configs" / "demo" / "default.yaml").shape
    config = target_config(family, shape, vocab_size=2048, bos=1, eos=2, pad=0)
    torch.manual_seed(0)
    model_cls = LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM
    return FrozenTarget(model_cls(config))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_demo_config_matches_golden(algorithm: str, family: str) -> None:
    # The demo targets here have no tokenizer: a draft with a mask token is given the demo
    # tokenizer's mask id.
    sets = ["draft.mask_token_id=3"] if has_field(algorithm, "mask_token_id") else []
    cfg = load_config(
        RunConfig, REPO / "configs" / "train" / f"{algorithm}-{family}-demo.yaml", sets
    )
    assert cfg.draft.algorithm == algorithm
    spec = get_draft(cfg.draft.algorithm)
    target = demo_target(family)
    vocab = build_vocab_mapping(torch.arange(2048).flip(0), 1024)
    drafter = spec.to_vllm(
        spec.build(cfg.draft, target, vocab).state_dict(), cfg.draft, target.description
    )
    validate_drafter(spec, drafter, target.description)
    golden = GOLDEN / f"{algorithm}-{family}-demo.config.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(drafter.config, indent=2) + "\n")
    assert drafter.config == json.loads(golden.read_text())


# EAGLE-3 variants beside the shipped configs: multi-layer, and EAGLE-3.1's three switches.
VARIANTS = {
    "layers2": ["draft.num_layers=2"],
    "eagle31": ["draft.norm_before_fc=true", "draft.fc_norm=true", "draft.norm_output=true"],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_eagle3_variant_config_matches_golden(variant: str, family: str) -> None:
    cfg = load_config(
        RunConfig, REPO / "configs" / "train" / f"eagle3-{family}-demo.yaml", VARIANTS[variant]
    )
    spec = get_draft("eagle3")
    target = demo_target(family)
    vocab = build_vocab_mapping(torch.arange(2048).flip(0), 1024)
    drafter = spec.to_vllm(
        spec.build(cfg.draft, target, vocab).state_dict(), cfg.draft, target.description
    )
    validate_drafter(spec, drafter, target.description)
    golden = GOLDEN / f"eagle3-{family}-{variant}-demo.config.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(drafter.config, indent=2) + "\n")
    assert drafter.config == json.loads(golden.read_text())


# P-EAGLE with EAGLE-3.1's norms before fc (vLLM serves P-EAGLE with its EAGLE-3 loader).
PEAGLE_VARIANTS = {"eagle31": ["draft.norm_before_fc=true", "draft.fc_norm=true"]}


@pytest.mark.parametrize("variant", sorted(PEAGLE_VARIANTS))
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_peagle_variant_config_matches_golden(variant: str, family: str) -> None:
    sets = ["draft.mask_token_id=3", *PEAGLE_VARIANTS[variant]]
    cfg = load_config(RunConfig, REPO / "configs" / "train" / f"peagle-{family}-demo.yaml", sets)
    spec = get_draft("peagle")
    target = demo_target(family)
    vocab = build_vocab_mapping(torch.arange(2048).flip(0), 1024)
    state = spec.build(cfg.draft, target, vocab).state_dict()
    drafter = spec.to_vllm(state, cfg.draft, target.description)
    validate_drafter(spec, drafter, target.description)
    # the norms' tensors ship under vLLM's names (its loader raises on an unknown one)
    assert {"input_norm.weight", "fc_norm.0.weight", "fc_norm.2.weight"} <= set(drafter.tensors)
    golden = GOLDEN / f"peagle-{family}-{variant}-demo.config.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(drafter.config, indent=2) + "\n")
    assert drafter.config == json.loads(golden.read_text())


def small_drafter(family: str = "llama"):
    cfg = load_config(RunConfig, REPO / "configs" / "train" / f"eagle3-{family}-demo.yaml")
    spec = get_draft("eagle3")
    target = demo_target(family)
    state = spec.build(cfg.draft, target, build_vocab_mapping(torch.ones(2048), 1024)).state_dict()
    return cfg, spec, target, state


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.pop("layers.0.hidden_norm.weight"), "missing tensor layers.0.hidden_norm"),
        (lambda s: s.pop("d2t"), "missing tensor d2t"),
        (lambda s: s.__setitem__("fc.weight", torch.zeros(128, 256)), "fc.weight has shape"),
    ],
)
def test_contract_violations_are_reported(mutate, message: str) -> None:
    cfg, spec, target, state = small_drafter()
    mutate(state)
    drafter = spec.to_vllm(state, cfg.draft, target.description)
    with pytest.raises(ExportError, match=message):
        validate_drafter(spec, drafter, target.description)


def test_unexpected_tensor_is_reported() -> None:
    cfg, spec, target, state = small_drafter()
    drafter = spec.to_vllm(state, cfg.draft, target.description)
    drafter.tensors["layers.0.self_attn.q_norm.weight"] = torch.ones(32)  # llama has none
    with pytest.raises(ExportError, match="unexpected tensor layers.0.self_attn.q_norm"):
        validate_drafter(spec, drafter, target.description)


def test_export_from_checkpoint_cli(tiny_world: Path, tiny_llama_data: Path, tmp_path: Path):
    from eagle_train.train import train

    cfg = run_config(
        tiny_world,
        tiny_llama_data,
        tmp_path / "run",
        "data.micro_batch_size=2",
        "data.max_length=64",
        "train.max_steps=2",
    )
    ckpt = train(cfg).last_checkpoint
    out = tmp_path / "drafter"
    result = CliRunner().invoke(export_draft_app, [str(ckpt), str(out)])
    assert result.exit_code == 0, result.output
    assert '"method": "eagle3"' in result.output
    assert sorted(p.name for p in out.iterdir()) == [
        ".eagle-train-files.json",  # what it wrote, for --overwrite (docs/file-safety.md)
        "README.md",
        "config.json",
        "eagle_train.json",
        "model.safetensors",
    ]
    card = (out / "README.md").read_text()
    target_path = tiny_world / "targets" / "llama" / "bf16"
    assert f"vllm serve {target_path} --speculative-config" in card
    assert f'"model": "{out.resolve()}"' in card and "| training steps | 2 of 2 |" in card
    assert "| K (tokens drafted per step) | 3 |" in card and "Not recorded here" in card
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["d2t"].dtype == torch.int64
    assert all(t.dtype == torch.bfloat16 for n, t in tensors.items() if n != "d2t")
    assert not any(n.startswith(("model.", "embed_tokens", "t2d")) for n in tensors)
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["norm_before_residual"] is False and config["draft_vocab_size"] == 256
    provenance = json.loads((out / "eagle_train.json").read_text())
    assert provenance["step"] == 2 and provenance["run_config"]["draft"]["ttt_steps"] == 3
    assert {"git_revision", "torch", "transformers"} <= provenance["versions"].keys()
    again = CliRunner().invoke(export_draft_app, [str(ckpt), str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import eagle_train.export as export

    cfg, spec, target, state = small_drafter()
    target.model.save_pretrained(tmp_path / "target")
    cfg = cfg.model_copy(
        update={"target": cfg.target.model_copy(update={"path": tmp_path / "target"})}
    )

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        export_state(state, cfg, tmp_path / "out", {"step": 0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def _summary(drafter: Path) -> dict:
    # a row written before tokens per target step was measured
    old = dict(requests=2, acceptance_length=1.5, tokens_per_s=9.0, speedup=None)
    row = dict(
        requests=4,
        tokens_per_target_step=2.125,
        acceptance_length=2.345,
        tokens_per_s=12.5,
        speedup=1.5,
    )
    return {
        "target": "T",
        "prompts": "mt_bench",
        "turns": 1,
        "baseline_tokens_per_s": 8.3,
        "drafters": {
            str(drafter): {
                "method": "eagle3",
                "num_speculative_tokens": 3,
                "overall": row,
                "categories": {"coding": {**row, "acceptance_length": 3.125}, "math": old},
            }
        },
    }


def test_model_card_gets_the_acceptance_table(tmp_path: Path) -> None:
    from eagle_train.model_card import record_acceptance

    cfg, spec, target, state = small_drafter()
    target.model.save_pretrained(tmp_path / "target")
    cfg = cfg.model_copy(
        update={"target": cfg.target.model_copy(update={"path": tmp_path / "target"})}
    )
    out = export_state(state, cfg, tmp_path / "d", {"step": 7})
    assert record_acceptance(out, _summary(out))
    card = (out / "README.md").read_text()
    assert "| coding | 4 | 2.125 | 3.125 | 12.5 | 1.50x |" in card
    assert "| math | 2 | - | 1.500 | 9.0 | - |" in card
    assert "| **overall** | 4 | 2.125 | 2.345 | 12.5 | 1.50x |" in card
    assert "Not recorded here" not in card
    assert json.loads((out / "eagle_train.json").read_text())["acceptance"]["turns"] == 1
    # A README.md someone else wrote is never replaced.
    (out / "README.md").write_text("my own card\n")
    assert not record_acceptance(out, _summary(out))
    assert (out / "README.md").read_text() == "my own card\n"


def test_record_acceptance_keeps_what_the_user_wrote(tmp_path: Path) -> None:
    """record-acceptance DRAFTER REPORT: an explicit action that rewrites only the card's
    Acceptance section; a section the user added (before or after it) stays byte for byte."""
    from typer.testing import CliRunner

    from eagle_train.cli import record_acceptance_app

    cfg, spec, target, state = small_drafter()
    target.model.save_pretrained(tmp_path / "target")
    cfg = cfg.model_copy(
        update={"target": cfg.target.model_copy(update={"path": tmp_path / "target"})}
    )
    out = export_state(state, cfg, tmp_path / "d", {"step": 7})
    card = (out / "README.md").read_text()
    head, _, _ = card.partition("## Acceptance")
    mine_before = "## My benchmark\n\nmeasured on our traffic: 2.9\n\n"
    mine_after = "\n## Licence notes\n\nsee LICENSE\n"
    (out / "README.md").write_text(head + mine_before + card[len(head) :] + mine_after)
    report = tmp_path / "report"
    report.mkdir()
    (report / "summary.json").write_text(json.dumps(_summary(out)))
    (report / "per_prompt.jsonl").write_text("")
    result = CliRunner().invoke(record_acceptance_app, [str(out), str(report)])
    assert result.exit_code == 0, result.output
    text = (out / "README.md").read_text()
    assert text.startswith(head + mine_before + "## Acceptance\n")
    assert text.endswith(mine_after)
    assert "| coding | 4 | 2.125 | 3.125 | 12.5 | 1.50x |" in text
    assert "Not recorded here" not in text
    # A report that did not measure this drafter: one line, nothing written.
    other = tmp_path / "other"
    (report / "summary.json").write_text(json.dumps({**_summary(out), "drafters": {}}))
    shutil.copytree(out, other)
    result = CliRunner().invoke(record_acceptance_app, [str(other), str(report)])
    assert result.exit_code == 2 and "not an export-draft output measured in" in result.output


def test_record_acceptance_keeps_the_export_its_own_and_a_users_edit_safe(tmp_path: Path) -> None:
    """After record-acceptance, an export whose card and provenance were as export-draft wrote
    them is still export-draft's own (--overwrite replaces it); where the user had edited the
    card, that edit is not taken into the record, so --overwrite refuses instead of losing
    it."""
    from typer.testing import CliRunner

    from eagle_train.cli import record_acceptance_app
    from eagle_train.fsutil import UnsafePathError

    cfg, spec, target, state = small_drafter()
    target.model.save_pretrained(tmp_path / "target")
    cfg = cfg.model_copy(
        update={"target": cfg.target.model_copy(update={"path": tmp_path / "target"})}
    )
    report = tmp_path / "report"
    report.mkdir()
    (report / "per_prompt.jsonl").write_text("")
    clean = export_state(state, cfg, tmp_path / "clean", {"step": 7})
    edited = export_state(state, cfg, tmp_path / "edited", {"step": 7})
    (edited / "README.md").write_text((edited / "README.md").read_text() + "\n## Mine\n\nkeep\n")
    for out in (clean, edited):
        (report / "summary.json").write_text(json.dumps(_summary(out)))
        result = CliRunner().invoke(record_acceptance_app, [str(out), str(report)])
        assert result.exit_code == 0, result.output
        assert "2.125" in (out / "README.md").read_text()
    export_state(state, cfg, clean, {"step": 8}, overwrite=True)
    assert '"step": 8' in (clean / "eagle_train.json").read_text()
    mine = (edited / "README.md").read_bytes()
    with pytest.raises(UnsafePathError, match="README.md"):
        export_state(state, cfg, edited, {"step": 8}, overwrite=True)
    assert (edited / "README.md").read_bytes() == mine
