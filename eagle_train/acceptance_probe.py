"""Acceptance length measured in vLLM while training: every N steps the current draft is
exported (the same validated path as export-draft), served next to the target on a small
prompt set, and its tokens per target step and acceptance length logged beside the training
metrics; the checkpoint with the most tokens per target step so far is kept under ``best/``."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from torch import Tensor

from eagle_train.evaluate.harness import run_eval
from eagle_train.evaluate.report import summarize
from eagle_train.evaluate.settings import EvalSettings
from eagle_train.export import export_state
from eagle_train.run_config import RunConfig

log = logging.getLogger(__name__)


class AcceptanceProbe:
    def __init__(self, cfg: RunConfig, out_dir: Path) -> None:
        self.cfg = cfg
        self.every = cfg.train.acceptance.every
        self.drafter_dir = out_dir / "acceptance" / "drafter"
        self.best = float("-inf")

    def due(self, step: int, last: bool) -> bool:
        return self.every is not None and (step % self.every == 0 or last)

    def measure(self, step: int, draft_state: dict[str, Tensor]) -> dict[str, float]:
        """Export the current draft (its full state dict) and return its vLLM acceptance
        metrics, with the probe's wall time (export, engine start, generation) in ``seconds``."""
        start = time.perf_counter()
        state = {k: v.detach().cpu() for k, v in draft_state.items()}
        export_state(state, self.cfg, self.drafter_dir, {"step": step}, overwrite=True)
        settings = EvalSettings(
            **self.cfg.train.acceptance.model_dump(exclude={"every"}),
            target=self.cfg.target.path,
            drafters=[self.drafter_dir],
            dtype=self.cfg.target.dtype,
            baseline=False,
            beside_greedy=False,  # the probe measures at train.acceptance's decoding only
        )
        overall: dict[str, Any] = summarize(run_eval(settings))["drafters"][str(self.drafter_dir)][
            "overall"
        ]
        metrics = {  # tokens per target step ranks (eval-acceptance's metric, steps.py)
            "tokens_per_target_step": overall["tokens_per_target_step"],
            "mean_request_tokens_per_target_step": overall["mean_request_tokens_per_target_step"],
            "acceptance_length": overall["acceptance_length"],  # over drafted steps
        }
        for i, rate in enumerate(overall["per_position_rate"]):
            metrics[f"accept_rate_{i}"] = rate
        metrics["seconds"] = time.perf_counter() - start
        log.info(
            "step %d: vLLM tokens per target step %.3f (AL over drafted steps %.3f)",
            step,
            metrics["tokens_per_target_step"],
            metrics["acceptance_length"],
        )
        return metrics

    def improved(self, metrics: dict[str, float]) -> bool:
        if metrics["tokens_per_target_step"] > self.best:
            self.best = metrics["tokens_per_target_step"]
            return True
        return False
