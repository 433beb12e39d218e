"""A randomly initialised EAGLE-3 drafter exported as a user's would be."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO
from run_configs import target_path

from eagle_train.config import load_config
from eagle_train.drafts.registry import get_draft
from eagle_train.export import export_state
from eagle_train.run_config import RunConfig
from eagle_train.target_model import FrozenTarget


def export_random(world: Path, family: str, out: Path) -> Path:
    target_dir = target_path(world, family)
    cfg = load_config(
        RunConfig,
        REPO / "configs" / "train" / f"eagle3-{family}-demo.yaml",
        [f"target.path={target_dir}", "data.train=unused"],
    )
    spec = get_draft("eagle3")
    state = spec.build(cfg.draft, FrozenTarget.from_pretrained(target_dir), None).state_dict()
    return export_state(state, cfg, out, {"step": 0})
