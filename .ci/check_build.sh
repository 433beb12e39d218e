#!/usr/bin/env bash
# Fails when building the package prints a deprecation warning (setuptools' BuildBackendWarning,
# SetuptoolsDeprecationWarning, ...): such a warning names a date after which a fresh machine's
# build may fail at the README's first command. Builds a wheel of SRC (default: this checkout)
# in an isolated build environment with the newest setuptools that pyproject.toml allows.
#   bash .ci/check_build.sh [SRC]
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-.}
PY=${PY:-.venv/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! log=$("$PY" -m pip wheel -v --no-deps --no-cache-dir -w "$out" "$SRC" 2>&1); then
    printf '%s\n' "$log" | tail -20 >&2
    echo "check_build: building $SRC failed (above)" >&2
    exit 1
fi
if printf '%s\n' "$log" | grep -E "Deprecat|BuildBackendWarning|SetuptoolsWarning" >&2; then
    echo "check_build: building $SRC warns about the package's metadata (above): fix pyproject.toml" >&2
    exit 1
fi
echo "check_build: $SRC builds with no deprecation warning"
