"""Command-line entry points. Each is thin: load a config, apply overrides, call one function."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from eagle_train.config import ConfigError, load_config

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config key: --set a.b=value (repeatable)."),
]


def _setup_logging(verbose: bool) -> None:
    # Under torchrun only rank 0 logs progress; other ranks report warnings and errors.
    quiet = os.environ.get("RANK", "0") != "0"
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=2)


build_demo_app = typer.Typer(add_completion=False, help="Build the tiny local demo world.")


@build_demo_app.command()
def build_demo_world(
    out_dir: Annotated[Path, typer.Argument(help="Where to write the world.")] = Path("demo_world"),
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing world.")] = False,
    verbose: bool = False,
) -> None:
    """Build the demo tokenizer, Llama and Qwen3 targets and chat data (seeded, no downloads)."""
    from eagle_train.demo.build import DemoConfig, build_demo_world

    _setup_logging(verbose)
    try:
        cfg = load_config(DemoConfig, config, overrides)
        summary = build_demo_world(cfg, out_dir, overwrite=overwrite)
    except (ConfigError, FileExistsError) as exc:
        raise _fail(exc) from None
    typer.echo(
        json.dumps(
            {
                k: summary[k]
                for k in ("num_train_chats", "num_val_chats", "targets", "build_seconds")
            },
            indent=2,
        )
    )
    typer.echo(f"demo world written to {out_dir}")


prepare_data_app = typer.Typer(add_completion=False, help="Tokenise chats into a training set.")


@prepare_data_app.command()
def prepare_data(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: bool = False,
) -> None:
    """Render chats with the target's template, mask assistant tokens, tokenise, and write a
    dataset the trainer reads; optionally regenerate the answers with the target itself and
    build the draft vocabulary mapping."""
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.data.errors import DataError
    from eagle_train.data.prepare import prepare_data as run

    _setup_logging(verbose)
    try:
        cfg = load_config(PrepareDataConfig, config, overrides)
        report = run(cfg)
    except (ConfigError, DataError) as exc:
        raise _fail(exc) from None
    typer.echo(report.summary())


train_draft_app = typer.Typer(add_completion=False, help="Train a draft model.")


@train_draft_app.command()
def train_draft(
    config: Annotated[Path, typer.Option("--config", "-c", help="Run config (YAML).")],
    overrides: SetOpt = None,
    resume: Annotated[
        str | None,
        typer.Option(
            help="'auto': continue from the newest intact checkpoint in the output dir (fresh "
            "if none); or a checkpoint directory."
        ),
    ] = None,
    verbose: bool = False,
) -> None:
    """Train a draft on a frozen target: target + data + draft + optim + train sections.
    Several processes: torchrun --nproc-per-node N $(which train-draft) -c ... (see
    scripts/launch.sh for several nodes)."""
    from eagle_train.checkpoint import CheckpointError
    from eagle_train.data.errors import DataError
    from eagle_train.run_config import RunConfig
    from eagle_train.train import NonFiniteLossError, train

    _setup_logging(verbose)
    if resume is not None:
        overrides = [*(overrides or []), f"train.resume={resume}"]
    try:
        cfg = load_config(RunConfig, config, overrides)
        result = train(cfg)
    except (ConfigError, DataError, CheckpointError, NonFiniteLossError) as exc:
        raise _fail(exc) from None
    if os.environ.get("RANK", "0") == "0":
        typer.echo(json.dumps(result.final_metrics, indent=2))
        typer.echo(f"last checkpoint: {result.last_checkpoint}")


export_draft_app = typer.Typer(add_completion=False, help="Export a draft for vLLM.")


@export_draft_app.command()
def export_draft(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint directory (step-*).")],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the vLLM drafter.")],
    overwrite: Annotated[bool, typer.Option(help="Replace an existing directory.")] = False,
) -> None:
    """Write a bf16 drafter vLLM serves as is, after checking it against vLLM's contract."""
    from eagle_train.export import ExportError, export_draft, serving_config

    _setup_logging(False)
    try:
        out = export_draft(checkpoint, out_dir, overwrite=overwrite)
    except (ConfigError, ExportError, FileExistsError, FileNotFoundError) as exc:
        raise _fail(exc) from None
    typer.echo(f"drafter written to {out}")
    typer.echo("speculative_config: " + json.dumps(serving_config(out)))


eval_acceptance_app = typer.Typer(add_completion=False, help="Acceptance length in vLLM.")


@eval_acceptance_app.command()
def eval_acceptance(
    target: Annotated[Path, typer.Option(help="The target model directory.")],
    draft: Annotated[list[Path], typer.Option(help="An exported drafter (repeatable).")],
    prompts: Annotated[
        str, typer.Option(help="'mt_bench' or a JSONL of prompts/messages.")
    ] = "mt_bench",
    turns: Annotated[int, typer.Option(help="1: first turn; 2: both turns.")] = 2,
    max_new_tokens: int = 256,
    num_speculative_tokens: Annotated[
        int | None, typer.Option(help="Default: what each export was trained for.")
    ] = None,
    dtype: Annotated[str, typer.Option(help="Explicit serving dtype.")] = "bfloat16",
    limit: Annotated[int | None, typer.Option(help="Use the first N prompts.")] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="Default: the target's own limit.")
    ] = None,
    kv_cache_memory_bytes: Annotated[
        int | None,
        typer.Option(help="vLLM KV cache size; default: vLLM's sizing on GPU, 512 MiB on CPU."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("runs/eval"),
) -> None:
    """Measure acceptance length (MT-Bench by default: greedy, one request at a time) of
    each drafter next to the target, per category, with the no-draft speed baseline and
    paired statistics between drafters."""
    from eagle_train.evaluate.drafter import DrafterError
    from eagle_train.evaluate.harness import EvalSettings, run_eval
    from eagle_train.evaluate.report import to_markdown, write_report

    _setup_logging(False)
    settings = EvalSettings(
        target=target,
        drafters=list(draft),
        prompts=prompts,
        turns=turns,
        max_new_tokens=max_new_tokens,
        num_speculative_tokens=num_speculative_tokens,
        dtype=dtype,
        limit=limit,
        max_model_len=max_model_len,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
    )
    try:
        run = run_eval(settings)
    except (DrafterError, ValueError) as exc:
        raise _fail(exc) from None
    summary = write_report(run, out)
    typer.echo(to_markdown(summary))
    typer.echo(f"per-prompt records, summary.json/.md and acceptance.png in {out}")


APPS = {
    "build-demo-world": build_demo_app,
    "prepare-data": prepare_data_app,
    "train-draft": train_draft_app,
    "export-draft": export_draft_app,
    "eval-acceptance": eval_acceptance_app,
}


def main(argv: list[str] | None = None) -> None:
    """``python -m eagle_train.cli <command> ...`` (what torchrun's ``-m`` launches)."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in APPS:
        raise SystemExit(f"usage: python -m eagle_train.cli {{{','.join(APPS)}}} ...")
    APPS[argv[0]](argv[1:], prog_name=argv[0])


if __name__ == "__main__":
    main()
