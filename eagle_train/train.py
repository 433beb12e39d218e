"""THE training loop, for every draft algorithm, on one process or many (torchrun + DDP).

Algorithm differences enter only through the draft spec (layer ids, build, loss parts); the
loop owns data, the frozen target forward, the optimizer (only via ``create_optimizer``,
checked by the precision guard), clipping, accumulation, validation, logging, checkpoints
and exact resume. Rank 0 alone writes logs and checkpoints; metrics are reduced over ranks.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from eagle_train.checkpoint import capture_rng_state, checkpoint_name, save_checkpoint
from eagle_train.data.loader import Batch
from eagle_train.data.packing import meter_metrics
from eagle_train.drafts.base import loss_parts
from eagle_train.drafts.cycles import finish_cycle_metrics
from eagle_train.drafts.sampled_acceptance import sampled_estimate
from eagle_train.errors import UserError
from eagle_train.metrics import WeightedMean, format_metrics
from eagle_train.parallel import (
    DistEnv,
    all_reduce_sum,
    any_rank,
    full_model_state,
    full_optimizer_state,
    gather_objects,
    gradient_sync,
    local_value,
)
from eagle_train.preemption import resume_command
from eagle_train.run_config import RunConfig
from eagle_train.train_setup import Run, open_run

log = logging.getLogger(__name__)
CONSOLE_KEYS = (
    "loss",
    "acc_0",
    "sim_accept_len",
    "cycle_accept_len",
    "lr",
    "grad_norm",
    "tokens_per_s",
)


class NonFiniteLossError(UserError, RuntimeError):
    pass


@dataclass
class TrainResult:
    output_dir: Path
    last_checkpoint: Path
    final_metrics: dict[str, float]
    skipped_steps: int = 0
    preempted_by: str | None = None  # the signal that stopped the run early


def train(cfg: RunConfig) -> TrainResult:
    with open_run(cfg) as run:
        val_metrics = _loop(run)
        run.close()
        checkpoint = run.out / "checkpoints" / checkpoint_name(run.state.step)
        log.info(
            "done: last checkpoint %s, %d skipped step(s)", checkpoint, run.state.skipped_steps
        )
        return TrainResult(
            output_dir=run.out,
            last_checkpoint=checkpoint,
            final_metrics=val_metrics,
            skipped_steps=run.state.skipped_steps,
            preempted_by=_stopped_early(run, checkpoint),
        )


def _loop(run: Run) -> dict[str, float]:
    """The steps from the resume point to ``max_steps``, or to the step at which a rank was
    asked to stop; returns the last validation metrics."""
    cfg, state = run.cfg.train, run.state
    bar = tqdm(
        range(state.step + 1, cfg.max_steps + 1),
        desc="train",
        mininterval=1.0,
        initial=state.step,
        total=cfg.max_steps,
        disable=not (cfg.progress and run.env.is_main),
    )
    window = _Window()
    val_metrics: dict[str, float] = {}
    for step in bar:
        grad_norm = _step(run, step, window)
        last = step == cfg.max_steps
        if step % cfg.log_every == 0 or last:
            metrics = window.result(run, grad_norm)
            run.metrics.write("train", step, metrics)
            bar.set_postfix_str(format_metrics(metrics, CONSOLE_KEYS))
            window = _Window()
        if run.val_batches and (step % cfg.val_every == 0 or last):
            val_metrics = validate(run)
            run.metrics.write("val", step, val_metrics)
            log.info("step %d val: %s", step, format_metrics(val_metrics, CONSOLE_KEYS))
        if run.probe.due(step, last):
            _probe(run, step)
        stop = any_rank(run.preemption.requested, run.env)  # every rank stops at the same step
        if step % cfg.save_every == 0 or last or stop:
            _save(run, run.out / "checkpoints", cfg.keep_last)
        if stop:
            break
    return val_metrics


def _step(run: Run, step: int, window: _Window) -> float:
    """One optimizer step (or a skipped one, agreed by all ranks so that all of them stop
    or skip together); returns the gradient norm."""
    step_metrics, step_tokens, finite = _accumulate(run)
    finite = not any_rank(not finite, run.env)
    grad_norm = _clip(run.params, run.cfg.train.grad_clip) if finite else math.nan
    if finite and math.isfinite(grad_norm):
        run.optimizer.step()
        run.guard.after_step(run.optimizer, step)
        window.mean.merge(step_metrics)
        window.tokens += step_tokens
    else:
        run.state.skipped_steps += 1
        _on_nonfinite(run, step, step_metrics.result())
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.state.step, run.state.loader = step, run.loader.state
    return grad_norm


@dataclass
class _Window:
    """The training metrics and tokens since the last logged step."""

    mean: WeightedMean = field(default_factory=WeightedMean)
    tokens: int = 0
    t0: float = field(default_factory=time.perf_counter)

    def result(self, run: Run, grad_norm: float) -> dict[str, float]:
        metrics = finish_cycle_metrics(_reduce(self.mean, run.env))
        elapsed = time.perf_counter() - self.t0
        total_tokens = int(all_reduce_sum(torch.tensor([self.tokens]), run.env).item())
        metrics.update(
            lr=run.scheduler.get_last_lr()[0],
            grad_norm=grad_norm,
            tokens_per_s=total_tokens / max(elapsed, 1e-9),
            skipped_steps=run.state.skipped_steps,
        )
        sums = all_reduce_sum(run.loader.meter.take(), run.env)
        metrics.update(meter_metrics(sums, elapsed, run.loader.data.source_names))
        return metrics


def _stopped_early(run: Run, checkpoint: Path) -> str | None:
    """The signal that stopped the run before max_steps (None when it ran to the end); rank
    0 logs how to continue."""
    step, max_steps = run.state.step, run.cfg.train.max_steps
    if step >= max_steps:
        return None
    name = run.preemption.name or "a signal to another rank"
    if run.env.is_main:
        log.warning(
            "stopped by %s after step %d of %d; checkpoint %s holds every finished step. "
            "Resume with: %s",
            name,
            step,
            max_steps,
            checkpoint,
            resume_command(),
        )
    return name


def _accumulate(run: Run) -> tuple[WeightedMean, int, bool]:
    """Forward+backward of ``grad_accum`` micro-batches; DDP reduces gradients once, in the
    backward of the last part of the last micro-batch."""
    metrics, tokens, finite = WeightedMean(), 0, True
    accum, c = run.cfg.train.grad_accum, run.c
    for micro in range(accum):
        batch = to_device(run.loader.next(), c.device)
        features = c.features.for_batch(batch)
        parts = loss_parts(c.spec, run.model, features, batch, run.cfg.draft)
        for i, part in enumerate(parts):
            with gradient_sync(run.model, micro == accum - 1 and i == len(parts) - 1):
                result = part()
                (result.loss / accum).backward()
            finite = finite and math.isfinite(result.loss.item())
            metrics.add(result.metrics, result.weight)
        tokens += batch.num_tokens
    return metrics, tokens, finite


@torch.no_grad()
def validate(run: Run) -> dict[str, float]:
    """Weighted validation metrics; ranks split the batches, each taking the same number
    (an FSDP2 forward is a collective). Runs on a forked RNG with a fixed seed: the same
    anchors/samples at every validation, and the training stream is not disturbed."""
    env, c, batches = run.env, run.c, run.val_batches
    usable = len(batches) - len(batches) % env.world_size
    shard = usable > 0
    mine = batches[env.rank : usable : env.world_size] if shard else batches
    mean = WeightedMean()
    devices = [env.device] if env.device.type == "cuda" else []
    c.draft.eval()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(run.cfg.train.seed)
        for batch in mine:
            batch = to_device(batch, c.device)
            features = c.val_features.for_batch(batch)
            result = c.spec.compute_loss(c.draft, features, batch, run.cfg.draft)
            sampled = sampled_estimate(  # at train.acceptance's temperature, when > 0
                c.spec,
                c.draft,
                features,
                batch,
                run.cfg.draft,
                result.metrics,
                run.cfg.train.acceptance,
            )
            mean.add({**result.metrics, **sampled}, result.weight)
    c.draft.train()
    return finish_cycle_metrics(_reduce(mean, env) if shard else mean.result())


def _reduce(mean: WeightedMean, env: DistEnv) -> dict[str, float]:
    """The weighted mean over every rank's micro-batches (ranks hold the same keys)."""
    keys = sorted(mean.sums)
    sums = torch.tensor([mean.sums[k] for k in keys] + [mean.weight], dtype=torch.float64)
    sums = all_reduce_sum(sums, env)
    weight = float(sums[-1])  # no supervised slot on any rank: no means (see WeightedMean)
    return {k: float(sums[i]) / weight for i, k in enumerate(keys)} if weight > 0 else {}


def _on_nonfinite(run: Run, step: int, metrics: dict[str, float]) -> None:
    what = f"non-finite loss or gradient norm at step {step} (loss {metrics.get('loss')})"
    cfg, skipped = run.cfg.train, run.state.skipped_steps
    if cfg.nonfinite == "stop":
        raise NonFiniteLossError(
            f"{what}; the last good checkpoint is kept. Set train.nonfinite=skip to skip "
            "such batches instead"
        )
    if skipped > cfg.max_skipped_steps:
        raise NonFiniteLossError(
            f"{what}: {skipped} steps skipped, more than train.max_skipped_steps"
        )
    log.warning("%s: skipped (%d so far)", what, skipped)


def _save(run: Run, root: Path, keep_last: int) -> None:
    rng_states = gather_objects(capture_rng_state(), run.env)  # every rank takes part
    draft_state = full_model_state(run.model)
    optimizer_state = full_optimizer_state(run.model, run.optimizer)
    if run.env.is_main:
        snapshot = replace(run.state, loader=replace(run.state.loader), files={})
        save_checkpoint(
            root,
            draft_state,
            optimizer_state,
            run.scheduler,
            run.cfg,
            snapshot,
            rng_states,
            run.c.vocab,
            keep_last,
        )


def _probe(run: Run, step: int) -> None:
    """Rank 0 serves the current draft in vLLM; the best is kept under ``best/``."""
    improved = False
    draft_state = full_model_state(run.model)
    if run.env.is_main:
        accept = run.probe.measure(step, draft_state)
        run.metrics.write("acceptance", step, accept)
        improved = run.probe.improved(accept)
        run.state.best_acceptance = run.probe.best
    if any_rank(improved, run.env):
        _save(run, run.out / "best", 1)


def to_device(batch: Batch, device: torch.device) -> Batch:
    return Batch(
        input_ids=batch.input_ids.to(device),
        loss_mask=batch.loss_mask.to(device),
        attention_mask=batch.attention_mask.to(device),
        lengths=batch.lengths.to(device),
        rows=batch.rows,
    )


def _clip(params: list[nn.Parameter], max_norm: float | None) -> float:
    """The global gradient norm (clipped to ``max_norm`` when set)."""
    if max_norm is None:
        grads = [p.grad for p in params if p.grad is not None]
        return local_value(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    return local_value(torch.nn.utils.clip_grad_norm_(params, max_norm))
