#!/usr/bin/env bash
# Build (or reuse) the XLA test environment: torch 2.9.0 (CPU) + torch-xla 2.9.0 + the accel packages, editable.
#
# The environment and uv's download cache live under ACCEL_XLA_ENV (default $HOME/.cache/accel-ci/xla-env), a folder
# CI keeps between runs; a second run with the same requirements only reinstalls the editable accel packages.
# Prints the interpreter's path last. Run the tests with tests/xla/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."

env_dir="${ACCEL_XLA_ENV:-$HOME/.cache/accel-ci/xla-env}"
export UV_CACHE_DIR="${ACCEL_XLA_UV_CACHE:-$env_dir/uv-cache}"
venv="$env_dir/venv"
python="$venv/bin/python"
stamp="$venv/.accel-requirements"

mkdir -p "$env_dir"
if [[ ! -x "$python" ]] || ! cmp -s tests/xla/requirements.txt "$stamp"; then
    rm -rf "$venv"
    uv venv --quiet --python 3.11 "$venv"
    # PyPI's torch 2.9.0 brings its CUDA libraries (most of the ~7 GB): torch-xla's wheel is built against it.
    uv pip install --quiet --python "$python" -r tests/xla/requirements.txt
    cp tests/xla/requirements.txt "$stamp"
fi
# The accel packages the XLA strategy runs with; --no-deps keeps torch at the pinned 2.9.0.
packages=(accel-core accel-data accel-checkpoint accel-xla accel)
args=()
for p in "${packages[@]}"; do
    [[ -d "packages/$p" ]] && args+=(-e "packages/$p")
done
uv pip install --quiet --python "$python" --no-deps "${args[@]}"
echo "$python"
