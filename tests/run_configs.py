"""One way for a test to build a run config on the tiny world: the target's path, the demo
config of an algorithm, the settings every short test run shares, and the three forms a test
needs (``key=value`` sets, a ``RunConfig``, the CLI's arguments).

A test names only what it is about; the rest is a short, quiet run::

    cfg = run_config(world, data, out, "train.max_steps=6")
    result = CliRunner().invoke(train_draft_app, cli_args(run_sets(world, data, out)))
"""

from __future__ import annotations

from pathlib import Path

from conftest import draft_vocab_sets

from eagle_train.config import load_config
from eagle_train.run_config import RunConfig

REPO = Path(__file__).resolve().parents[1]


def target_path(world: Path, family: str = "llama", dtype: str = "bf16") -> Path:
    """The tiny world's target of ``family`` saved in ``dtype``."""
    return world / "targets" / family / dtype


def demo_config(algo: str = "eagle3", family: str = "llama") -> Path:
    """The shipped demo run config of ``algo`` for ``family``'s target."""
    return REPO / "configs" / "train" / f"{algo}-{family}-demo.yaml"


# What a short test run sets unless the test says otherwise: no validation, no progress bar,
# no tensorboard (later sets of the same key win, so a test's own come after these).
QUIET = ("data.val=null", "train.progress=false", "train.tensorboard=false")


def run_sets(
    world: Path,
    data: Path | str,
    out: Path,
    *extra: str,
    algo: str = "eagle3",
    family: str = "llama",
    dtype: str = "bf16",
) -> list[str]:
    """``key=value`` overrides of ``demo_config(algo)``: the tiny target saved in ``dtype``
    (and run in it: the demo configs say bfloat16), ``data`` as data.train, ``out`` as
    train.output_dir, the tests' draft vocabulary, then ``extra``."""
    return [
        f"target.path={target_path(world, family, dtype)}",
        *(["target.dtype=float32"] if dtype == "fp32" else []),
        f"data.train={data}",
        f"train.output_dir={out}",
        *QUIET,
        *draft_vocab_sets(algo),
        *extra,
    ]


def run_config(
    world: Path, data: Path | str, out: Path, *extra: str, algo: str = "eagle3", **kw: str
) -> RunConfig:
    """The validated ``RunConfig`` of ``run_sets`` on the demo config of ``algo``."""
    family = kw.get("family", "llama")
    return load_config(
        RunConfig, demo_config(algo, family), run_sets(world, data, out, *extra, algo=algo, **kw)
    )


def cli_args(sets: list[str], algo: str = "eagle3", family: str = "llama") -> list[str]:
    """The arguments of ``train-draft``/``prepare-features`` for ``sets`` on the demo config."""
    args = ["-c", str(demo_config(algo, family))]
    for s in sets:
        args += ["--set", s]
    return args
