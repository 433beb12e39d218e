"""What the training loop (train.py) is set up with, as one ``Run``: the checks made before
anything is loaded, the run directory's lock and resolved paths, the checkpoint to resume
from, the components (target, feature sources, draft and its draft vocabulary), the wrapped
model, optimizer and schedule, the metrics sink and the validation batches. Rank-aware where
ranks must agree."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from eagle_train.acceptance_probe import AcceptanceProbe
from eagle_train.checkpoint import (
    CheckpointError,
    Resumed,
    TrainerState,
    checkpoint_problems,
    find_resumable,
    load_for_resume,
    restore_rng_state,
)
from eagle_train.config import ConfigError
from eagle_train.data.loader import Batch, BatchLoader, PreparedData
from eagle_train.data.mixture import open_training_data
from eagle_train.data.packing import packing_budget, row_stats
from eagle_train.data.store import PreparedDataError
from eagle_train.data.template_match import check_chat_template
from eagle_train.data.vocab import TokenCounter, VocabMapping, build_vocab_mapping
from eagle_train.drafts.base import DraftSpec
from eagle_train.drafts.registry import check_servable, get_draft
from eagle_train.drafts.warm_start import initial_vocab, warm_start
from eagle_train.features import feature_sources, load_target
from eagle_train.fsutil import (
    UnsafePathError,
    check_output_path,
    hold_lock,
    remove_stale_temporaries_in,
)
from eagle_train.metrics import MetricLog, MetricSink
from eagle_train.optim import (
    PrecisionGuard,
    build_lr_scheduler,
    create_optimizer,
    resolve_storage_dtype,
)
from eagle_train.parallel import (
    DistEnv,
    all_reduce_sum,
    barrier,
    gather_objects,
    init_distributed,
    load_full_state,
    shutdown,
    wrap_model,
)
from eagle_train.preemption import Preemption
from eagle_train.preflight import check_memory
from eagle_train.run_config import RunConfig
from eagle_train.run_dir import check_run_directory, nothing_left_if_failed, write_run_config
from eagle_train.target_model import FrozenTarget, load_target_description
from eagle_train.target_model.source import FeatureSource

log = logging.getLogger(__name__)


@dataclass
class Components:
    target: FrozenTarget  # whole, FSDP2-sharded, or its head alone (features from a cache)
    features: FeatureSource  # training batches' target features (online or cached)
    val_features: FeatureSource
    spec: DraftSpec
    draft: nn.Module  # the bare module (checkpoints, validation); the loop trains its DDP wrap
    layer_ids: list[int]
    vocab: VocabMapping | None
    device: torch.device


def build_components(
    cfg: RunConfig, data: PreparedData, env: DistEnv, vocab: VocabMapping | None = None
) -> Components:
    target = load_target(cfg, env)
    spec = get_draft(cfg.draft.algorithm)
    layer_ids = spec.target_layer_ids(cfg.draft, target.description)
    features, val_features = feature_sources(cfg, target, layer_ids, env)
    if spec.uses_draft_vocab:
        vocab_size = target.description.vocab_size
        vocab = vocab or initial_vocab(cfg.draft, spec, vocab_size)
        vocab = vocab or draft_vocab(cfg, data, vocab_size, env)
    draft = spec.build(cfg.draft, target, vocab)
    draft = draft.to(device=env.device, dtype=resolve_storage_dtype(target.dtype, cfg.optim))
    return Components(
        target=target,
        features=features,
        val_features=val_features,
        spec=spec,
        draft=draft,
        layer_ids=layer_ids,
        vocab=vocab,
        device=env.device,
    )


@dataclass
class Run:
    """Everything the training loop reads and moves, built once by ``setup_run``."""

    cfg: RunConfig  # paths resolved, data-dependent draft defaults filled in
    env: DistEnv
    out: Path  # the run directory
    c: Components
    loader: BatchLoader
    model: nn.Module  # what the loop trains: ``c.draft`` wrapped for DDP or sharded by FSDP2
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    state: TrainerState  # step, loader position, skipped steps, best acceptance
    guard: PrecisionGuard
    metrics: MetricSink  # rank 0 writes metrics.jsonl; other ranks' sink does nothing
    val_batches: list[Batch]
    probe: AcceptanceProbe
    params: list[nn.Parameter]  # the trainable ones, for clipping
    preemption: Preemption

    def close(self) -> None:
        """After the last step: the last checkpoint exists before any rank returns, and the
        process group goes."""
        self.metrics.close()
        barrier(self.env)
        # DDP's reducer holds the gloo group; destroying the group under it can deadlock.
        del self.model
        gc.collect()
        shutdown(self.env)


@contextmanager
def open_run(cfg: RunConfig) -> Iterator[Run]:
    """The run, set up; refused before anything is loaded or written when vLLM could not
    serve the result. Rank 0 holds the run directory for the whole block: a second run on it
    is refused, and nothing in it (stale temporaries, metrics, checkpoints) is touched by two
    runs."""
    out = check_output_path(cfg.train.output_dir, "train.output_dir")
    cfg = with_resolved_paths(cfg, out)
    check_run_directory(cfg, out)  # no input overlapped, nothing but an earlier run's files
    train = cfg.data.train
    datasets = [train] if isinstance(train, Path) else [s.path for s in train]
    datasets += [cfg.data.val] if cfg.data.val else []
    check_chat_template(datasets, cfg.target.path, cfg.data.allow_chat_template_mismatch)
    description = load_target_description(cfg.target.path)
    check_servable(get_draft(cfg.draft.algorithm), description)
    get_draft(cfg.draft.algorithm).target_layer_ids(cfg.draft, description)  # ids in range
    check_draft_vocab_size(cfg, description.vocab_size)
    env = init_distributed(cfg.train.device, cfg.train.dist_timeout_s)
    # a run that fails before its first metrics line or checkpoint leaves nothing behind
    with nothing_left_if_failed(out, env.is_main, run_lock(out, env)):
        with Preemption(announce=env.is_main) as preemption:
            yield setup_run(cfg, env, out, preemption)


def setup_run(cfg: RunConfig, env: DistEnv, out: Path, preemption: Preemption) -> Run:
    """The config written, the components built, the state restored from the resume point
    (or the per-rank sampling streams seeded), in the order that makes a resume bit-exact."""
    data = open_training_data(cfg.data.train, cfg.data.max_length)
    check_rows_fit_target(data, cfg)  # before the target's weights are loaded
    cfg = with_data_defaults(cfg, data.meta)  # before config.yaml is written: it holds the choice
    resumed = resume_point(cfg, out, env)
    torch.manual_seed(cfg.train.seed)  # the same initial draft on every rank
    c = build_components(cfg, data, env, resumed.vocab if resumed else None)
    check_memory(cfg, c.spec, c.target, c.draft, data, env)  # before anything is written
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_run_config(cfg, out)
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
        max_tokens=packing_budget(
            cfg.data.packing,
            cfg.data.max_tokens_per_batch,
            cfg.data.micro_batch_size,
            data.rows,
            cfg.data.max_length,
        ),
    )
    model = wrap_model(c.draft, env, cfg.train.parallel)  # FSDP2 shards c.draft in place
    optimizer = create_optimizer(c.draft, cfg.optim)
    scheduler = build_lr_scheduler(optimizer, cfg.optim, cfg.train.max_steps)
    state = TrainerState(step=0, loader=loader.state, world_size=env.world_size)
    if resumed is not None:
        state = restore(resumed, model, optimizer, scheduler, loader, env, cfg.target.path)
    else:
        torch.manual_seed(cfg.train.seed + env.rank)  # per-rank sampling streams
    guard = PrecisionGuard(enabled=cfg.optim.fp32_master_weights)
    metrics = (
        MetricLog(out, cfg.train.tensorboard, after_step=state.step)
        if env.is_main
        else MetricSink()
    )
    val_batches = validation_batches(cfg, pad_id)
    probe = AcceptanceProbe(cfg, out)
    probe.best = state.best_acceptance if state.best_acceptance is not None else probe.best
    params = [p for p in c.draft.parameters() if p.requires_grad]
    log.info(
        "draft %s: %.2fM trainable parameters, target layers %s, %d train rows, "
        "%d rank(s), starting at step %d",
        *(cfg.draft.algorithm, sum(p.numel() for p in params) / 1e6, c.layer_ids, len(data)),
        *(env.world_size, state.step),
    )
    return Run(
        cfg=cfg,
        env=env,
        out=out,
        c=c,
        loader=loader,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        guard=guard,
        metrics=metrics,
        val_batches=val_batches,
        probe=probe,
        params=params,
        preemption=preemption,
    )


@contextmanager
def run_lock(out: Path, env: DistEnv) -> Iterator[None]:
    if not env.is_main:
        yield
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnsafePathError(f"train.output_dir {out}: cannot create it: {exc.strerror}") from None
    with hold_lock(out / ".train-draft.lock", f"run directory {out}"):
        yield


def with_resolved_paths(cfg: RunConfig, out: Path) -> RunConfig:
    """Local paths made absolute, so the config a checkpoint stores (and export-draft
    reads) means the same files from any working directory."""

    def resolved(path: Path | None) -> Path | None:
        return path.resolve() if path is not None and path.exists() else path

    return cfg.model_copy(
        update={
            "target": cfg.target.model_copy(update={"path": resolved(cfg.target.path)}),
            "data": cfg.data.model_copy(
                update={
                    "train": resolved(cfg.data.train)
                    if isinstance(cfg.data.train, Path)
                    else [
                        s.model_copy(
                            update={"path": resolved(s.path), "features": resolved(s.features)}
                        )
                        for s in cfg.data.train
                    ],
                    "val": resolved(cfg.data.val),
                    "features": resolved(cfg.data.features),
                }
            ),
            "train": cfg.train.model_copy(update={"output_dir": out}),
        }
    )


def with_data_defaults(cfg: RunConfig, meta: dict) -> RunConfig:
    """Draft settings whose default depends on the training data, resolved from its
    ``meta.json`` by the draft config's own ``for_training_data`` (where it has one)."""
    resolve = getattr(cfg.draft, "for_training_data", None)
    if resolve is None:
        return cfg
    return cfg.model_copy(update={"draft": resolve(meta)})


def resume_point(cfg: RunConfig, out: Path, env: DistEnv) -> Resumed | None:
    """Rank 0 picks the checkpoint (or none) and verifies it; every rank then reads it."""
    chosen: str | None = None
    if env.is_main:
        root = out / "checkpoints"
        remove_stale_temporaries_in(root, "step-*")  # left by a save that was killed
        if cfg.train.resume == "auto":
            found = find_resumable(root)
            chosen = str(found) if found else None
            if found is None:
                log.info("resume auto: no checkpoint under %s, starting fresh", root)
        elif cfg.train.resume is not None:
            problems = checkpoint_problems(Path(cfg.train.resume))
            if problems:
                raise CheckpointError(
                    f"cannot resume from {cfg.train.resume}: " + "; ".join(problems)
                )
            chosen = cfg.train.resume
        elif any(root.glob("step-*")) if root.is_dir() else False:
            raise CheckpointError(
                f"{root} already holds checkpoints: pass --resume auto (train.resume=auto) "
                "to continue that run, or choose another train.output_dir"
            )
    chosen = gather_objects(chosen, env)[0]
    if chosen is None:
        return None
    resumed = load_for_resume(Path(chosen))
    if resumed.config.draft != cfg.draft:
        raise CheckpointError(
            f"{chosen}: the draft section differs from this run's config "
            f"(checkpoint {resumed.config.draft!r}, now {cfg.draft!r})"
        )
    step, max_steps = resumed.state.step, cfg.train.max_steps
    if step > max_steps:
        raise CheckpointError(
            f"{chosen}: the checkpoint is at step {step}, past train.max_steps {max_steps}: "
            "raise train.max_steps to continue training it"
        )
    if step == max_steps:
        log.warning("%s is at train.max_steps %d already: nothing left to train", chosen, step)
    log.info("resuming from %s (step %d)", chosen, step)
    return resumed


def restore(
    resumed: Resumed,
    model: nn.Module,
    optimizer,
    scheduler,
    loader: BatchLoader,
    env: DistEnv,
    target: Path | None = None,
) -> TrainerState:
    try:
        load_full_state(model, optimizer, resumed.draft, resumed.optimizer)
    except (RuntimeError, KeyError, ValueError) as exc:
        # another target (a Llama run resumed with a Qwen3 target), or draft settings
        # changed since: the saved tensors do not fit this run's draft
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        was = resumed.config.target.path
        raise CheckpointError(
            f"{resumed.path}: does not fit this run's draft (saved for target {was} with its "
            f"own draft settings; this run: target {target}): {first[:200]}. "
            "Resume with the run's own target and draft settings, or start a new run"
        ) from None
    scheduler.load_state_dict(resumed.scheduler)
    state = resumed.state
    loader.state = replace(state.loader)
    if state.world_size == env.world_size:
        restore_rng_state(resumed.rng_states[env.rank])
    else:
        log.warning(
            "resuming %d rank(s) from a %d-rank checkpoint: the data position is "
            "kept, but RNG streams are re-seeded, so the run is not bit-exact",
            env.world_size,
            state.world_size,
        )
        torch.manual_seed(resumed.config.train.seed + env.rank + state.step)
    return replace(state, loader=loader.state, world_size=env.world_size, files={})


def check_rows_fit_target(data: PreparedData, cfg: RunConfig) -> None:
    """Rows train whole up to the target's context (``max_position_embeddings``); a longer
    row (after the data.max_length crop) would train on positions the target never serves."""
    context = load_target_description(cfg.target.path).max_position_embeddings
    lengths = row_stats(data.rows, cfg.data.max_length)[0]
    longest = int(lengths.max()) if len(lengths) else 0
    if longest > context:
        raise ConfigError(
            f"data.max_length: rows of up to {longest} tokens exceed the target's context "
            f"(max_position_embeddings {context}): set data.max_length={context} or less"
        )


def check_draft_vocab_size(cfg: RunConfig, vocab_size: int) -> None:
    """Refuse a draft vocabulary larger than the target's, before anything is loaded."""
    size = getattr(cfg.draft, "draft_vocab_size", None)
    if size is not None and size > vocab_size:
        raise ConfigError(
            f"draft.draft_vocab_size {size} is larger than the target vocabulary ({vocab_size})"
        )


def draft_vocab(
    cfg: RunConfig, data: PreparedData, vocab_size: int, env: DistEnv | None = None
) -> VocabMapping | None:
    """The mapping of ``draft.draft_vocab_size`` (None: the whole target vocabulary) from the
    counts prepare-data wrote; a dataset without them is counted here over all ranks' shards."""
    size = getattr(cfg.draft, "draft_vocab_size", None)
    if size is None:
        return None
    check_draft_vocab_size(cfg, vocab_size)
    counts = data.token_counts
    if counts is not None and len(counts) != vocab_size:
        raise PreparedDataError(
            f"{data.path}: token counts over {len(counts)} ids, but the target vocabulary is "
            f"{vocab_size}: prepare the data with this target's tokenizer"
        )
    if counts is None:
        env = env or DistEnv()
        counter = TokenCounter(vocab_size)
        shard = data.rows.shard(num_shards=env.world_size, index=env.rank, contiguous=False)
        for ids, mask in zip(shard["input_ids"], shard["loss_mask"], strict=True):
            counter.add(ids, mask)
        counts = all_reduce_sum(counter.result(), env)
    mapping = build_vocab_mapping(counts, size)
    total = int(counts.sum())
    log.info(
        "draft vocabulary: top %d of %d target ids over %d supervised tokens; it covers %.1f%% "
        "of them (%d distinct ids were seen)",
        size,
        vocab_size,
        total,
        100.0 * int(counts[mapping.t2d].sum()) / max(total, 1),
        int((counts > 0).sum()),
    )
    return mapping


def validation_batches(cfg: RunConfig, pad_id: int) -> list[Batch]:
    if cfg.data.val is None:
        return []
    val = PreparedData(cfg.data.val)
    loader = BatchLoader(
        val, cfg.data.micro_batch_size, cfg.data.seed, pad_id, cfg.data.max_length, shuffle=False
    )
    return loader.epoch_batches()[: cfg.train.val_batches]
