"""Command-line entry points. Each is thin: load a config, apply overrides, call one function."""

from __future__ import annotations

import json
import logging
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
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
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
    typer.echo(json.dumps({k: summary[k] for k in ("num_train_chats", "num_val_chats",
                                                    "targets", "build_seconds")}, indent=2))
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
    verbose: bool = False,
) -> None:
    """Train a draft on a frozen target: target + data + draft + optim + train sections."""
    from eagle_train.data.errors import DataError
    from eagle_train.run_config import RunConfig
    from eagle_train.train import train

    _setup_logging(verbose)
    try:
        cfg = load_config(RunConfig, config, overrides)
        result = train(cfg)
    except (ConfigError, DataError) as exc:
        raise _fail(exc) from None
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
