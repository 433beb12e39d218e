"""THE training loop, for every draft algorithm, on one process or many (torchrun + DDP).

Algorithm differences enter only through the draft spec (layer ids, build, loss parts); the
loop owns data, the frozen target forward, the optimizer (only via ``create_optimizer``,
checked by the precision guard), clipping, accumulation, validation, logging, checkpoints
and exact resume. Rank 0 alone writes logs and checkpoints; metrics are reduced over ranks.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from eagle_train.acceptance_probe import AcceptanceProbe
from eagle_train.checkpoint import (
    TrainerState,
    capture_rng_state,
    checkpoint_name,
    save_checkpoint,
)
from eagle_train.config import dump_config
from eagle_train.data.loader import Batch, BatchLoader, PreparedData
from eagle_train.drafts.base import loss_parts
from eagle_train.drafts.registry import check_servable, get_draft
from eagle_train.drafts.warm_start import warm_start
from eagle_train.errors import UserError
from eagle_train.fsutil import check_output_path
from eagle_train.metrics import MetricLog, WeightedMean, format_metrics
from eagle_train.optim import (
    PrecisionGuard,
    build_lr_scheduler,
    create_optimizer,
)
from eagle_train.parallel import (
    DistEnv,
    all_reduce_sum,
    any_rank,
    barrier,
    full_model_state,
    full_optimizer_state,
    gather_objects,
    gradient_sync,
    init_distributed,
    local_value,
    shutdown,
    wrap_model,
)
from eagle_train.preemption import Preemption, resume_command
from eagle_train.run_config import RunConfig
from eagle_train.target import load_target_description
from eagle_train.train_setup import (
    Components,
    build_components,
    check_draft_vocab_size,
    restore,
    resume_point,
    run_lock,
    to_device,
    validation_batches,
    with_data_defaults,
    with_resolved_paths,
)

log = logging.getLogger(__name__)
CONSOLE_KEYS = ("loss", "acc_0", "sim_accept_len", "lr", "grad_norm", "tokens_per_s")


class NonFiniteLossError(UserError, RuntimeError):
    pass


@dataclass
class TrainResult:
    output_dir: Path
    last_checkpoint: Path
    final_metrics: dict[str, float]
    skipped_steps: int = 0
    preempted_by: str | None = None  # the signal that stopped the run early


def forward_loss(c: Components, model: nn.Module, batch: Batch, cfg: RunConfig):
    """Validation's forward: the loss of one batch of the validation set."""
    batch = to_device(batch, c.device)
    features = c.val_features.for_batch(batch)
    return c.spec.compute_loss(model, features, batch, cfg.draft)


def train(cfg: RunConfig) -> TrainResult:
    out = check_output_path(cfg.train.output_dir, "train.output_dir")
    cfg = with_resolved_paths(cfg, out)
    # Refused before anything is loaded or written when vLLM could not serve the result.
    description = load_target_description(cfg.target.path)
    check_servable(get_draft(cfg.draft.algorithm), description)
    check_draft_vocab_size(cfg, description.vocab_size)
    env = init_distributed(cfg.train.device, cfg.train.dist_timeout_s)
    # Rank 0 holds the run directory for the whole run: a second run on it is refused, and
    # nothing below (stale temporaries, metrics, checkpoints) is touched by two runs.
    with run_lock(out, env), Preemption(announce=env.is_main) as preemption:
        return _train(cfg, env, out, preemption)


def _train(cfg: RunConfig, env: DistEnv, out: Path, preemption: Preemption) -> TrainResult:
    data = PreparedData(cfg.data.train)
    cfg = with_data_defaults(cfg, data.meta)  # before config.yaml is written: it holds the choice
    resumed = resume_point(cfg, out, env)
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, out / "config.yaml")

    torch.manual_seed(cfg.train.seed)  # the same initial draft on every rank
    c = build_components(cfg, data, env, resumed.vocab if resumed else None)
    warm_start(cfg.draft, c.spec, c.draft, c.target.description, fresh=resumed is None)
    pad_id = c.target.description.pad_token_id or 0  # a multimodal config keeps it in text_config
    loader = BatchLoader(
        data,
        cfg.data.micro_batch_size,
        cfg.data.seed,
        pad_id,
        cfg.data.max_length,
        rank=env.rank,
        world_size=env.world_size,
        grad_accum=cfg.train.grad_accum,
    )
    model = wrap_model(c.draft, env, cfg.train.parallel)  # FSDP2 shards c.draft in place
    optimizer = create_optimizer(c.draft, cfg.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.optim, cfg.train.max_steps)
    state = TrainerState(step=0, loader=loader.state, world_size=env.world_size)
    if resumed is not None:
        state = restore(resumed, model, optimizer, scheduler, loader, env)
    else:
        torch.manual_seed(cfg.train.seed + env.rank)  # per-rank sampling streams
    guard = PrecisionGuard(enabled=cfg.optim.fp32_master_weights)
    metric_log = (
        MetricLog(out, cfg.train.tensorboard, after_step=state.step) if env.is_main else None
    )
    val_batches = validation_batches(cfg, pad_id)
    probe = AcceptanceProbe(cfg, out)
    probe.best = state.best_acceptance if state.best_acceptance is not None else probe.best
    params = [p for p in c.draft.parameters() if p.requires_grad]
    log.info(
        "draft %s: %.2fM trainable parameters, target layers %s, %d train rows, "
        "%d rank(s), starting at step %d",
        cfg.draft.algorithm,
        sum(p.numel() for p in params) / 1e6,
        c.layer_ids,
        len(data),
        env.world_size,
        state.step,
    )

    c.draft.train()
    bar = tqdm(
        range(state.step + 1, cfg.train.max_steps + 1),
        desc="train",
        mininterval=1.0,
        initial=state.step,
        total=cfg.train.max_steps,
        disable=not (cfg.train.progress and env.is_main),
    )
    window, tokens, t0 = WeightedMean(), 0, time.perf_counter()
    val_metrics: dict[str, float] = {}
    for step in bar:
        step_metrics, step_tokens, finite = _accumulate(model, c, loader, cfg)
        # Agreed by all ranks, so that all of them stop or skip together.
        finite = not any_rank(not finite, env)
        grad_norm = _clip(params, cfg.train.grad_clip) if finite else math.nan
        if finite and math.isfinite(grad_norm):
            optimizer.step()
            guard.after_step(optimizer, step)
            window.merge(step_metrics)
            tokens += step_tokens
        else:
            state.skipped_steps += 1
            _on_nonfinite(cfg, step, state.skipped_steps, step_metrics.result())
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step, state.loader = step, loader.state

        last = step == cfg.train.max_steps
        if step % cfg.train.log_every == 0 or last:
            metrics = _reduce(window, env)
            elapsed = time.perf_counter() - t0
            total_tokens = int(all_reduce_sum(torch.tensor([tokens]), env).item())
            metrics.update(
                lr=scheduler.get_last_lr()[0],
                grad_norm=grad_norm,
                tokens_per_s=total_tokens / max(elapsed, 1e-9),
                skipped_steps=state.skipped_steps,
            )
            if metric_log is not None:
                metric_log.write("train", step, metrics)
            bar.set_postfix_str(format_metrics(metrics, CONSOLE_KEYS))
            window, tokens, t0 = WeightedMean(), 0, time.perf_counter()
        if val_batches and (step % cfg.train.val_every == 0 or last):
            val_metrics = validate(c, val_batches, cfg, env)
            if metric_log is not None:
                metric_log.write("val", step, val_metrics)
            log.info("step %d val: %s", step, format_metrics(val_metrics, CONSOLE_KEYS))
        _probe(probe, step, last, model, c, optimizer, scheduler, cfg, state, env, metric_log)
        saving = step % cfg.train.save_every == 0 or last
        stop = any_rank(preemption.requested, env)  # every rank stops at the same step
        if saving or stop:
            _save(
                out / "checkpoints",
                model,
                c,
                optimizer,
                scheduler,
                cfg,
                state,
                env,
                cfg.train.keep_last,
            )
        if stop:
            break
    if metric_log is not None:
        metric_log.close()
    barrier(env)  # the last checkpoint exists before any rank returns
    # DDP's reducer holds the gloo group; destroying the group under it can deadlock at exit.
    del model
    gc.collect()
    shutdown(env)
    checkpoint = out / "checkpoints" / checkpoint_name(state.step)
    log.info("done: last checkpoint %s, %d skipped step(s)", checkpoint, state.skipped_steps)
    return TrainResult(
        output_dir=out,
        last_checkpoint=checkpoint,
        final_metrics=val_metrics,
        skipped_steps=state.skipped_steps,
        preempted_by=_stopped_early(cfg, state.step, checkpoint, preemption, env),
    )


def _stopped_early(
    cfg: RunConfig, step: int, checkpoint: Path, preemption: Preemption, env: DistEnv
) -> str | None:
    """The signal that stopped the run before max_steps (None when it ran to the end); rank
    0 logs how to continue."""
    if step >= cfg.train.max_steps:
        return None
    name = preemption.name or "a signal to another rank"
    if env.is_main:
        log.warning(
            "stopped by %s after step %d of %d; checkpoint %s holds every finished step. "
            "Resume with: %s",
            name,
            step,
            cfg.train.max_steps,
            checkpoint,
            resume_command(),
        )
    return name


def _accumulate(model: nn.Module, c: Components, loader: BatchLoader, cfg: RunConfig):
    """Forward+backward of ``grad_accum`` micro-batches; DDP reduces gradients once, in the
    backward of the last part of the last micro-batch."""
    metrics, tokens, finite = WeightedMean(), 0, True
    accum = cfg.train.grad_accum
    for micro in range(accum):
        batch = to_device(loader.next(), c.device)
        features = c.features.for_batch(batch)
        parts = loss_parts(c.spec, model, features, batch, cfg.draft)
        for i, part in enumerate(parts):
            with gradient_sync(model, micro == accum - 1 and i == len(parts) - 1):
                result = part()
                (result.loss / accum).backward()
            finite = finite and math.isfinite(result.loss.item())
            metrics.add(result.metrics, result.weight)
        tokens += batch.num_tokens
    return metrics, tokens, finite


@torch.no_grad()
def validate(c: Components, batches: list[Batch], cfg: RunConfig, env: DistEnv):
    """Weighted validation metrics; ranks split the batches, each taking the same number
    (an FSDP2 forward is a collective). Runs on a forked RNG with a fixed seed: the same
    anchors/samples at every validation, and the training stream is not disturbed."""
    usable = len(batches) - len(batches) % env.world_size
    shard = usable > 0
    mine = batches[env.rank : usable : env.world_size] if shard else batches
    mean = WeightedMean()
    devices = [env.device] if env.device.type == "cuda" else []
    c.draft.eval()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg.train.seed)
        for batch in mine:
            result = forward_loss(c, c.draft, batch, cfg)
            mean.add(result.metrics, result.weight)
    c.draft.train()
    return _reduce(mean, env) if shard else mean.result()


def _reduce(mean: WeightedMean, env: DistEnv) -> dict[str, float]:
    """The weighted mean over every rank's micro-batches (ranks hold the same keys)."""
    keys = sorted(mean.sums)
    sums = torch.tensor([mean.sums[k] for k in keys] + [mean.weight], dtype=torch.float64)
    sums = all_reduce_sum(sums, env)
    weight = max(float(sums[-1]), 1.0)
    return {k: float(sums[i]) / weight for i, k in enumerate(keys)}


def _on_nonfinite(cfg: RunConfig, step: int, skipped: int, metrics: dict[str, float]) -> None:
    what = f"non-finite loss or gradient norm at step {step} (loss {metrics.get('loss')})"
    if cfg.train.nonfinite == "stop":
        raise NonFiniteLossError(
            f"{what}; the last good checkpoint is kept. Set train.nonfinite=skip to skip "
            "such batches instead"
        )
    if skipped > cfg.train.max_skipped_steps:
        raise NonFiniteLossError(
            f"{what}: {skipped} steps skipped, more than train.max_skipped_steps"
        )
    log.warning("%s: skipped (%d so far)", what, skipped)


def _save(
    root: Path,
    model: nn.Module,
    c: Components,
    optimizer,
    scheduler,
    cfg: RunConfig,
    state: TrainerState,
    env: DistEnv,
    keep_last: int,
) -> None:
    rng_states = gather_objects(capture_rng_state(), env)  # every rank takes part
    draft_state, optimizer_state = full_model_state(model), full_optimizer_state(model, optimizer)
    if env.is_main:
        snapshot = replace(state, loader=replace(state.loader), files={})
        save_checkpoint(
            root,
            draft_state,
            optimizer_state,
            scheduler,
            cfg,
            snapshot,
            rng_states,
            c.vocab,
            keep_last,
        )


def _probe(
    probe: AcceptanceProbe,
    step: int,
    last: bool,
    model: nn.Module,
    c: Components,
    optimizer,
    scheduler,
    cfg: RunConfig,
    state: TrainerState,
    env: DistEnv,
    metric_log,
) -> None:
    """When due, rank 0 serves the current draft in vLLM; the best is kept under ``best/``."""
    if not probe.due(step, last):
        return
    improved = False
    draft_state = full_model_state(model)
    if env.is_main:
        accept = probe.measure(step, draft_state)
        metric_log.write("acceptance", step, accept)
        improved = probe.improved(accept)
        state.best_acceptance = probe.best
    if any_rank(improved, env):
        _save(
            Path(cfg.train.output_dir) / "best", model, c, optimizer, scheduler, cfg, state, env, 1
        )


def _clip(params: list[nn.Parameter], max_norm: float | None) -> float:
    """The global gradient norm (clipped to ``max_norm`` when set)."""
    if max_norm is None:
        grads = [p.grad for p in params if p.grad is not None]
        return local_value(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    return local_value(torch.nn.utils.clip_grad_norm_(params, max_norm))
