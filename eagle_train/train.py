"""THE training loop, for every draft algorithm.

Algorithm differences enter only through the draft spec (layer ids, build, loss); the loop
owns data, the frozen target forward, the optimizer (only via ``create_optimizer``, checked
by the precision guard after every step), clipping, accumulation, validation, logging and
checkpoints.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from eagle_train.checkpoint import save_checkpoint
from eagle_train.config import dump_config
from eagle_train.data.loader import BatchLoader, PreparedData
from eagle_train.drafts.base import Batch, DraftSpec
from eagle_train.drafts.registry import get_draft
from eagle_train.evaluate.during_training import AcceptanceProbe
from eagle_train.metrics import MetricLog, WeightedMean, format_metrics
from eagle_train.optim import (
    PrecisionGuard,
    build_lr_scheduler,
    create_optimizer,
    resolve_storage_dtype,
)
from eagle_train.run_config import DTYPES, RunConfig, resolve_device
from eagle_train.target import FrozenTarget

log = logging.getLogger(__name__)
CONSOLE_KEYS = ("loss", "acc_0", "sim_accept_len", "lr", "grad_norm", "tokens_per_s")


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class TrainResult:
    output_dir: Path
    last_checkpoint: Path
    final_metrics: dict[str, float]


@dataclass
class Components:
    target: FrozenTarget
    spec: DraftSpec
    draft: nn.Module
    layer_ids: list[int]


def build_components(cfg: RunConfig, data: PreparedData, device: torch.device) -> Components:
    target = FrozenTarget.from_pretrained(cfg.target.path, DTYPES[cfg.target.dtype], str(device))
    spec = get_draft(cfg.draft.algorithm)
    layer_ids = spec.target_layer_ids(cfg.draft, target.config)
    draft = spec.build(cfg.draft, target, data.vocab)
    draft = draft.to(device=device, dtype=resolve_storage_dtype(target.dtype, cfg.optim))
    return Components(target=target, spec=spec, draft=draft, layer_ids=layer_ids)


def forward_loss(c: Components, batch: Batch, cfg: RunConfig, device: torch.device):
    batch = Batch(*(t.to(device) for t in (batch.input_ids, batch.loss_mask,
                                           batch.attention_mask, batch.lengths)))
    features = c.target.features(batch.input_ids, batch.attention_mask, c.layer_ids)
    return c.spec.compute_loss(c.draft, features, batch, cfg.draft)


@torch.no_grad()
def validate(c: Components, batches: list[Batch], cfg: RunConfig, device: torch.device):
    c.draft.eval()
    mean = WeightedMean()
    for batch in batches:
        result = forward_loss(c, batch, cfg, device)
        mean.add(result.metrics, result.weight)
    c.draft.train()
    return mean.result()


def train(cfg: RunConfig) -> TrainResult:
    torch.manual_seed(cfg.train.seed)
    device = resolve_device(cfg.train.device)
    out = Path(cfg.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.yaml")

    data = PreparedData(cfg.data.train)
    c = build_components(cfg, data, device)
    pad_id = c.target.config.pad_token_id or 0
    loader = BatchLoader(data, cfg.data.micro_batch_size, cfg.data.seed, pad_id,
                         cfg.data.max_length)
    val_batches = _validation_batches(cfg, pad_id)
    optimizer = create_optimizer(c.draft, cfg.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.optim, cfg.train.max_steps)
    guard = PrecisionGuard(enabled=cfg.optim.fp32_master_weights)
    metric_log = MetricLog(out, cfg.train.tensorboard)
    params = [p for p in c.draft.parameters() if p.requires_grad]
    log.info("draft %s: %.2fM trainable parameters, target layers %s, %d train rows",
             cfg.draft.algorithm, sum(p.numel() for p in params) / 1e6, c.layer_ids, len(data))

    c.draft.train()
    bar = tqdm(range(1, cfg.train.max_steps + 1), disable=not cfg.train.progress, desc="train",
               mininterval=1.0)
    window, tokens, t0 = WeightedMean(), 0, time.perf_counter()
    checkpoint, val_metrics = None, {}
    probe = AcceptanceProbe(cfg, out)
    for step in bar:
        for _ in range(cfg.train.grad_accum):
            batch = loader.next()
            result = forward_loss(c, batch, cfg, device)
            if not math.isfinite(result.loss.item()):
                raise NonFiniteLossError(f"non-finite loss {result.loss.item()} at step {step}")
            (result.loss / cfg.train.grad_accum).backward()
            window.add(result.metrics, result.weight)
            tokens += batch.num_tokens
        grad_norm = _clip(params, cfg.train.grad_clip)
        optimizer.step()
        guard.after_step(optimizer, step)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        last = step == cfg.train.max_steps
        if step % cfg.train.log_every == 0 or last:
            elapsed = time.perf_counter() - t0
            metrics = {**window.result(), "lr": scheduler.get_last_lr()[0],
                       "grad_norm": grad_norm, "tokens_per_s": tokens / max(elapsed, 1e-9)}
            metric_log.write("train", step, metrics)
            bar.set_postfix_str(format_metrics(metrics, CONSOLE_KEYS))
            window, tokens, t0 = WeightedMean(), 0, time.perf_counter()
        if val_batches and (step % cfg.train.val_every == 0 or last):
            val_metrics = validate(c, val_batches, cfg, device)
            metric_log.write("val", step, val_metrics)
            log.info("step %d val: %s", step, format_metrics(val_metrics, CONSOLE_KEYS))
        if step % cfg.train.save_every == 0 or last:
            checkpoint = save_checkpoint(out / "checkpoints", step, c.draft, optimizer, scheduler,
                                         cfg, loader.state, cfg.train.keep_last)
        if probe.due(step, last):
            accept = probe.measure(step, c.draft)
            metric_log.write("acceptance", step, accept)
            if probe.improved(accept):
                save_checkpoint(out / "best", step, c.draft, optimizer, scheduler, cfg,
                                loader.state, keep_last=1)
    metric_log.close()
    assert checkpoint is not None  # the last step always saves
    log.info("done: last checkpoint %s", checkpoint)
    return TrainResult(output_dir=out, last_checkpoint=checkpoint, final_metrics=val_metrics)


def _validation_batches(cfg: RunConfig, pad_id: int) -> list[Batch]:
    if cfg.data.val is None:
        return []
    val = PreparedData(cfg.data.val)
    loader = BatchLoader(val, cfg.data.micro_batch_size, cfg.data.seed, pad_id,
                         cfg.data.max_length, shuffle=False)
    return loader.epoch_batches()[: cfg.train.val_batches]


def _clip(params: list[nn.Parameter], max_norm: float | None) -> float:
    if max_norm is None:
        grads = [p.grad.float().norm() for p in params if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
