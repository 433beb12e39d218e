"""Warm start (``draft.init_from``): a drafter directory in any layout vLLM 0.32 serves,
checked against the target and the run's draft config, loaded into the freshly built draft.

Layouts: export-draft's native one (config.json as vLLM reads it, the draft's own tensor
names), the vllm-project/speculators one (``speculators_config`` in config.json; the native
config is rebuilt as vLLM's speculators loader does), and SafeAILab's (a Llama-style config,
``midlayer.*`` tensors, ``d2t``/``t2d``, safetensors or ``pytorch_model.bin``). The algorithm's
own maps (``from_speculators``, ``import_tensors``) live beside its export map."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from eagle_train.config import ConfigError
from eagle_train.data.vocab import VocabMapping
from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.contract import contract_problems
from eagle_train.drafts.registry import DRAFTS, identify_drafter
from eagle_train.target_model import TargetDescription

log = logging.getLogger(__name__)

# config.json keys that fix the draft's structure, each with the run setting that sets it
# (None: the target's; FIXED: no setting, every draft of this version has vLLM's value) and
# vLLM's value when a drafter's config leaves it out.
_STRUCTURE: dict[str, tuple[str | None, Any]] = {
    "hidden_size": (None, None),
    "target_hidden_size": (None, None),
    "intermediate_size": (None, None),
    "num_attention_heads": (None, None),
    "num_key_value_heads": ("draft.num_kv_heads", None),
    "head_dim": (None, None),
    "vocab_size": (None, None),
    "rms_norm_eps": (None, None),
    "num_hidden_layers": ("draft.num_layers", None),
    "model_type": ("draft.qk_norm (true: qwen3, false: llama)", "llama"),
    "eagle_aux_hidden_state_layer_ids": ("draft.aux_layer_ids", None),
    "num_aux_hidden_states": ("draft.aux_layer_ids", None),
    "norm_before_residual": ("FIXED", False),
    "norm_before_fc": ("draft.norm_before_fc", False),
    "fc_norm": ("draft.fc_norm", False),
    "norm_output": ("draft.norm_output", False),
    "mask_token_id": ("draft.mask_token_id", None),
    "dflash_config.target_layer_ids": ("draft.target_layer_ids", None),
    "target_layer_ids": ("draft.target_layer_ids", None),
    "dflash_config.mask_token_id": ("draft.mask_token_id", None),
}


@dataclass
class Drafter:
    path: Path
    layout: str  # "native", "speculators" or "safeailab"
    spec: DraftSpec  # the algorithm whose format it is
    native: dict[str, Any]  # vLLM's native config, vLLM's defaults filled in
    tensors: dict[str, Tensor]  # vLLM's names (t2d included where shipped)


def _fail(path: Path, what: str) -> ConfigError:
    return ConfigError(f"draft.init_from {path}: {what}")


def read_drafter(path: Path) -> Drafter:
    """The drafter at ``path``: native config and tensors, whichever layout it is in."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise _fail(path, f"expected a drafter directory with a config.json ({exc})") from None
    layout = "native"
    if "speculators_config" in raw:
        layout = "speculators"
        found = [c for s in DRAFTS.values() if (c := s.from_speculators(raw)) is not None]
        if not found:
            raise _fail(
                path,
                f"speculators type {raw.get('speculators_model_type')!r} is not "
                "one this version trains",
            )
        raw = found[0]
    tensors = _read_tensors(path)
    if any(n.startswith("midlayer.") for n in tensors):
        layout = "safeailab"
    try:
        spec = identify_drafter(raw)
        config = dict(raw)
        config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    except (ValueError, KeyError) as exc:
        raise _fail(path, f"config.json: {exc}") from None
    config.setdefault("target_hidden_size", config["hidden_size"])
    if spec.uses_draft_vocab:  # the defaults of vLLM's loader for a drafter with a head
        if config.get("draft_vocab_size") is None:
            config["draft_vocab_size"] = config["vocab_size"]
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        config.setdefault("num_aux_hidden_states", len(ids) if ids else 3)
    return Drafter(path=path, layout=layout, spec=spec, native=config, tensors=tensors)


def _read_tensors(path: Path) -> dict[str, Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if files:
        tensors: dict[str, Tensor] = {}
        for file in files:
            try:
                tensors.update(load_file(str(file)))
            except Exception as exc:  # safetensors' error for a cut file or a bad header
                raise _fail(path, f"{file.name}: not a readable safetensors file ({exc})") from None
        return tensors
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise _fail(path, "no *.safetensors or pytorch_model.bin with the drafter's tensors")
    tensors = {}
    for file in bins:
        try:  # weights_only: a pickle that would run code is refused, never executed
            loaded = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise _fail(
                path, f"{file.name}: not a plain tensor file (refused unpickling: {first[:200]})"
            ) from None
        if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, Tensor) for k, v in loaded.items()
        ):
            raise _fail(path, f"{file.name}: expected a mapping of tensor names to tensors")
        tensors.update(loaded)
    return tensors


def drafter_ids(drafter: Drafter) -> Tensor:
    """Target id of each row of the drafter's head (its whole vocabulary without d2t)."""
    vd = drafter.native.get("draft_vocab_size") or drafter.native["vocab_size"]
    d2t = drafter.tensors.get("d2t")
    base = torch.arange(vd, dtype=torch.int64)
    return base if d2t is None else base + d2t.to(torch.int64)


def initial_vocab(cfg: Any, spec: DraftSpec, target_vocab_size: int) -> VocabMapping | None:
    """The drafter's own draft vocabulary, kept when ``draft.draft_vocab_size`` is unset or
    equals it; None when there is no drafter, the draft has no vocabulary of its own, or the
    config asks for another size (the data's vocabulary is then built as for a fresh run)."""
    if cfg.init_from is None or not spec.uses_draft_vocab:
        return None
    drafter = read_drafter(Path(cfg.init_from))
    ids = drafter_ids(drafter)
    wanted = getattr(cfg, "draft_vocab_size", None)
    if wanted is not None and wanted != len(ids):
        log.info(
            "draft.init_from: the drafter's %d-token vocabulary is replaced by the data's "
            "top %d (head rows move by target id; the others start from the target's head)",
            len(ids),
            wanted,
        )
        return None
    vocab_size = drafter.native["vocab_size"]
    if vocab_size != target_vocab_size:
        raise _fail(
            drafter.path,
            f"config vocab_size {vocab_size} != the target's vocab size {target_vocab_size}: "
            "the drafter was made for another target",
        )
    if len(ids) > vocab_size or int(ids.max()) >= vocab_size:
        raise _fail(drafter.path, f"d2t maps outside the vocabulary of {vocab_size}")
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    counts = torch.zeros(vocab_size, dtype=torch.int64)  # the vocabulary came from the drafter
    return VocabMapping(d2t=ids - torch.arange(len(ids)), t2d=t2d, counts=counts)


def check_drafter(
    drafter: Drafter, spec: DraftSpec, cfg: Any, target: TargetDescription, draft: nn.Module
) -> None:
    """Raise ConfigError (one line) where the drafter is not this run's draft: another
    algorithm, vLLM's contract broken, or another structure than the run config builds."""
    found = drafter.spec
    if found.name != spec.name:
        raise _fail(
            drafter.path,
            f"a {found.name!r} drafter (method {found.vllm_method!r}), but draft.algorithm is "
            f"{spec.name!r}",
        )
    shapes = {n: (tuple(t.shape), t.dtype) for n, t in drafter.tensors.items() if n != "t2d"}
    shapes = _renamed(drafter, shapes)
    problems = contract_problems(spec, drafter.native, shapes, target)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise _fail(drafter.path, problems[0] + more)
    ours = spec.to_vllm(draft.state_dict(), cfg, target).config
    for key, (setting, default) in _STRUCTURE.items():
        mine, theirs = _get(ours, key, None), _get(drafter.native, key, default)
        if key == "eagle_aux_hidden_state_layer_ids" and theirs is None:
            theirs = list(target.default_aux_layer_ids)  # vLLM's default for the target
        if mine is None or theirs == mine:
            continue
        fix = (
            "this version trains only the value vLLM's EAGLE-3 layer has; the drafter "
            "cannot be continued"
            if setting == "FIXED"
            else f"set {setting}"
            if setting
            else "the drafter was made for another target"
        )
        raise _fail(
            drafter.path, f"config {key} is {theirs!r}, this run's draft has {mine!r} ({fix})"
        )


def _renamed(drafter: Drafter, shapes: dict) -> dict:
    """Tensor shapes under vLLM's names (SafeAILab's ``midlayer.`` is vLLM's ``layers.0.``)."""
    if drafter.layout != "safeailab":
        return shapes
    return {n.replace("midlayer.", "layers.0."): s for n, s in shapes.items()}


def _get(config: dict[str, Any], key: str, default: Any) -> Any:
    head, _, rest = key.partition(".")
    value = config.get(head, default if not rest else None)
    if rest:
        return value.get(rest, default) if isinstance(value, dict) else default
    return value


def warm_start(
    cfg: Any, spec: DraftSpec, draft: nn.Module, target: TargetDescription, fresh: bool = True
) -> None:
    """Load ``cfg.init_from`` into the freshly built ``draft`` (in place), after checking it;
    nothing on a resumed run (``fresh`` False: the checkpoint holds its weights)."""
    if cfg.init_from is None or not fresh:
        return
    drafter = read_drafter(Path(cfg.init_from))
    check_drafter(drafter, spec, cfg, target, draft)
    state = draft.state_dict()
    loaded = spec.import_tensors(drafter.tensors, drafter.native)
    loaded.pop("t2d", None)
    loaded.pop("d2t", None)  # the draft's vocabulary is the one it was built with
    if "lm_head.weight" in loaded and "d2t" in state:
        loaded["lm_head.weight"] = _head_rows(drafter, loaded["lm_head.weight"], draft, state)
    unknown = sorted(set(loaded) - set(state))
    if unknown:
        raise _fail(drafter.path, f"tensor {unknown[0]} has no place in the draft")
    for name, tensor in loaded.items():
        if tensor.shape != state[name].shape:
            raise _fail(
                drafter.path,
                f"tensor {name} has shape {list(tensor.shape)}, the draft's is "
                f"{list(state[name].shape)}",
            )
    ref = state[next(iter(state))]
    draft.load_state_dict(
        {**state, **{n: t.to(device=ref.device, dtype=state[n].dtype) for n, t in loaded.items()}}
    )
    log.info(
        "draft.init_from: %d tensors from %s (%s layout); the optimizer starts fresh",
        len(loaded),
        drafter.path,
        drafter.layout,
    )


def _head_rows(drafter: Drafter, head: Tensor, draft: nn.Module, state: dict) -> Tensor:
    """The drafter's head rows placed at the draft's rows by target id; rows of target ids
    the drafter's vocabulary lacks keep the draft's initialisation (the target's head)."""
    theirs = drafter_ids(drafter)
    ours = torch.arange(len(draft.d2t)) + draft.d2t.cpu()
    if torch.equal(theirs, ours):
        return head
    position = torch.full((drafter.native["vocab_size"],), -1, dtype=torch.int64)
    position[theirs] = torch.arange(len(theirs))
    found = position[ours]
    keep = found >= 0
    rows = state["lm_head.weight"].detach().cpu().clone().to(head.dtype)
    rows[keep] = head[found[keep]]
    log.info(
        "draft.init_from: %d of %d head rows from the drafter (same target id), %d from the "
        "target's head",
        int(keep.sum()),
        len(ours),
        int((~keep).sum()),
    )
    return rows
