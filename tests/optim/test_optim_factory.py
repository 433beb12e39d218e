"""create_optimizer, parameter groups, resolve_storage_dtype, OptimConfig and the schedule."""

from __future__ import annotations

import pytest
import torch
from optim_helpers import TinyDraft
from torch import nn

from eagle_train.config import ConfigError, load_config
from eagle_train.optim import (
    MasterWeightAdamW,
    OptimConfig,
    build_lr_scheduler,
    build_param_groups,
    create_optimizer,
    resolve_storage_dtype,
)


class ScaleNorm(nn.Module):
    """A norm whose gain is 2-D: exempt from decay by its type name, not by ndim."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2, 16))


class Draft(TinyDraft):
    def __init__(self) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        self.hidden_norm = LlamaRMSNorm(16)
        self.q_norm = Qwen3RMSNorm(8)
        self.scale = ScaleNorm()
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.tied = self.head  # tied module: its params must appear once


def group_names(groups: list[dict]) -> tuple[set[str], set[str]]:
    decay = {name for name, _ in groups[0]["params"]}
    no_decay = {name for name, _ in groups[1]["params"]}
    return decay, no_decay


def test_param_groups_decay_only_weight_matrices() -> None:
    groups = build_param_groups(Draft(), weight_decay=0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    decay, no_decay = group_names(groups)
    assert decay == {"fc.weight", "up.weight", "down.weight", "head.weight"}
    assert no_decay == {
        "embed.weight",
        "up.bias",
        "norm.weight",
        "hidden_norm.weight",
        "q_norm.weight",
        "scale.weight",
    }
    assert not any(name.startswith(("frozen.", "tied.")) for name in decay | no_decay)


def test_create_optimizer_builds_master_weight_adamw_with_names() -> None:
    model = Draft()
    cfg = OptimConfig(lr=3e-4, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    opt = create_optimizer(model, cfg)
    assert isinstance(opt, MasterWeightAdamW)
    assert opt.implementation == "compiled"  # auto: the fastest exact-enough kernel
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert all(g["lr"] == 3e-4 and g["betas"] == (0.8, 0.9) for g in opt.param_groups)
    assert all(g["decoupled_weight_decay"] for g in opt.param_groups)
    names = [n for g in opt.state_dict()["param_groups"] for n in g["param_names"]]
    assert "norm.weight" in names and "frozen.weight" not in names
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for g in opt.param_groups for p in g["params"]} == trainable


def test_opt_out_builds_plain_torch_optimizers() -> None:
    model = TinyDraft()
    off = OptimConfig(fp32_master_weights=False)
    assert type(create_optimizer(model, off)) is torch.optim.AdamW
    with pytest.raises(ValueError, match="implementation=compiled"):
        create_optimizer(model, off.model_copy(update={"implementation": "compiled"}))


def test_no_trainable_parameters_is_a_clear_error() -> None:
    model = TinyDraft().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        create_optimizer(model, OptimConfig())


def test_resolve_storage_dtype_rules() -> None:
    bf16 = torch.bfloat16
    # No explicit dtype: the target's dtype, with or without fp32 masters in the optimizer.
    assert resolve_storage_dtype(bf16, OptimConfig()) == bf16
    assert resolve_storage_dtype(bf16, OptimConfig(fp32_master_weights=False)) == bf16
    assert resolve_storage_dtype(torch.float32, OptimConfig()) == torch.float32
    # An explicit dtype is respected.
    assert resolve_storage_dtype(bf16, OptimConfig(dtype="float32")) == torch.float32
    assert resolve_storage_dtype(torch.float32, OptimConfig(dtype="bfloat16")) == bf16
    assert resolve_storage_dtype(bf16, OptimConfig(dtype="float16")) == torch.float16
    with pytest.raises(ValueError, match="floating point"):
        resolve_storage_dtype(torch.int64, OptimConfig())


def test_optim_config_defaults_and_validation(tmp_path) -> None:
    cfg = OptimConfig()
    assert (cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay) == (
        1e-4,
        (0.9, 0.95),
        1e-8,
        0.01,
    )
    assert cfg.fp32_master_weights and cfg.dtype == "auto"
    path = tmp_path / "optim.yaml"
    path.write_text("lr: 3.0e-4\nbetas: [0.9, 0.99]\nimplementation: compiled\n")
    loaded = load_config(OptimConfig, path, ["fp32_master_weights=false"])
    assert loaded.betas == (0.9, 0.99) and not loaded.fp32_master_weights
    with pytest.raises(ConfigError, match="unknown key 'nesterov'"):
        load_config(OptimConfig, None, ["nesterov=true"])
    with pytest.raises(ConfigError, match="betas"):
        load_config(OptimConfig, None, ["betas=[0.9, 1.0]"])
    with pytest.raises(ConfigError, match="implementation"):
        load_config(OptimConfig, None, ["implementation=apex"])


def test_lr_schedule_warmup_then_cosine_to_floor() -> None:
    param = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=1.0)
    cfg = OptimConfig(warmup_steps=4, min_lr_ratio=0.1)
    sched = build_lr_scheduler(opt, cfg, total_steps=14)
    lrs = []
    for _ in range(16):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:5] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    assert lrs[9] == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the decay
    assert lrs[14:] == pytest.approx([0.1, 0.1])
    constant = build_lr_scheduler(
        torch.optim.SGD([param], lr=2.0), cfg.model_copy(update={"schedule": "constant"}), 10
    )
    assert constant.get_last_lr() == pytest.approx([0.5])
