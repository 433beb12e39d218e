"""The install keeps working: building the package prints no deprecation warning about its
metadata (.ci/check_build.sh, which CI runs), and a deprecation warning raised from eagle_train
itself fails the tests (pyproject.toml's filterwarnings) while a third party's does not. Each
check is shown to fail when the problem is put back."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_a_deprecation_warning_from_eagle_train_fails_the_test() -> None:
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        with pytest.raises(category, match="old call"):
            warnings.warn_explicit("old call", category, "x.py", 1, module="eagle_train.data.x")


def test_a_third_partys_deprecation_warning_stays_a_warning() -> None:
    for module in ("transformers.utils", "eagle_training_tools"):
        with pytest.warns(DeprecationWarning, match="their call"):
            warnings.warn_explicit("their call", DeprecationWarning, "y.py", 1, module=module)


def test_the_metadata_is_declared_the_current_way() -> None:
    """PEP 639: an SPDX expression and license files, read by setuptools >= 77."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    for name in meta["project"]["license-files"]:
        assert (REPO / name).is_file(), name
    assert "setuptools>=77" in meta["build-system"]["requires"]


def copy_source(dest: Path) -> Path:
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, dest / name)
    shutil.copytree(REPO / "eagle_train", dest / "eagle_train",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return dest


def check_build(src: Path) -> subprocess.CompletedProcess:
    env = {"PY": sys.executable, "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", ".ci/check_build.sh", str(src)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
def test_the_build_check_passes_now_and_fails_on_the_deprecated_license_table(
    tmp_path: Path,
) -> None:
    (tmp_path / "now").mkdir()
    (tmp_path / "old").mkdir()
    src = copy_source(tmp_path / "now")
    ok = check_build(src)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    old = copy_source(tmp_path / "old")
    meta = old / "pyproject.toml"
    meta.write_text(meta.read_text().replace('license = "Apache-2.0"', 'license = { text = "Apache-2.0" }')
                    .replace("license-files = ", "# license-files = "))  # fmt: skip
    bad = check_build(old)
    assert bad.returncode == 1
    assert "TOML table is deprecated" in bad.stderr
    assert "warns about the package's metadata" in bad.stderr
