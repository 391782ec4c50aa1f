#!/usr/bin/env bash
# Write requirements/constraints.txt (used by scripts/install.sh as `pip install -c`): exact versions for every
# package the requirement files leave open, resolved by `uv pip compile` from PyPI for the venv's Python.
# Torch is excluded from the resolution, so neither torch nor what only torch needs is pinned: install.sh lets a GPU
# user choose another torch build (PETALS_CHAIN_TORCH_SPEC) and those must follow it. petals itself is left out as
# install.sh installs it --no-deps (requirements/petals.txt). uv is fetched from PyPI once into <repo>/.cache.
# Usage: bash requirements/lock.sh            (PYTHON=/path/to/python overrides <repo>/.venv/bin/python)
set -euo pipefail

REQ="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$REQ")"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
UV_VERSION="0.13.8"
UV_DIR="$ROOT/.cache/uv-$UV_VERSION"

if [[ ! -x "$PY" ]]; then
    echo "error: python interpreter not found: $PY (create the venv or set PYTHON)" >&2
    exit 2
fi
if [[ ! -x "$UV_DIR/bin/uv" ]]; then
    echo "installing uv==$UV_VERSION into $UV_DIR" >&2
    "$PY" -m pip install --quiet --no-deps --target "$UV_DIR" "uv==$UV_VERSION" >&2
fi

cd "$REQ"
"$UV_DIR/bin/uv" pip compile --quiet --no-config --python "$PY" \
    --excludes <(echo torch) --no-emit-package setuptools \
    --custom-compile-command "bash requirements/lock.sh" --output-file constraints.txt \
    hivemind.txt petals-deps.txt project.txt extra.txt
echo "wrote $REQ/constraints.txt: $(grep -c '^[A-Za-z0-9]' constraints.txt) pins" >&2
