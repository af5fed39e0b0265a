#!/usr/bin/env bash
# Build (or reuse) the XLA test environment: the accel packages, editable, installed as a user installs them,
# `accel[xla]` (whose extra pins torch 2.9.0 next to torch-xla 2.9.0), plus the test tools of requirements.txt.
#
# The environment and uv's download cache live under ACCEL_XLA_ENV (default $HOME/.cache/accel-ci/xla-env), a folder
# CI keeps between runs; a second run only checks what is installed (and reinstalls the editable accel packages).
# Prints the interpreter's path last. Run the tests with tests/xla/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."

env_dir="${ACCEL_XLA_ENV:-$HOME/.cache/accel-ci/xla-env}"
export UV_CACHE_DIR="${ACCEL_XLA_UV_CACHE:-$env_dir/uv-cache}"
venv="$env_dir/venv"
python="$venv/bin/python"

mkdir -p "$env_dir"
if [[ ! -x "$python" ]]; then
    uv venv --quiet --python 3.11 "$venv"
fi
# The accel packages the XLA strategy runs with, resolved with their dependencies: the torch pair comes from the
# `xla` extra, so this is the pin a user's `pip install "accel[xla]"` gets. PyPI's torch 2.9.0 brings its CUDA
# libraries (most of the ~7 GB downloaded the first time): torch-xla's wheel is built against it.
packages=(accel-core accel-data accel-checkpoint accel-tracking accel-launch accel-xla)
args=()
for p in "${packages[@]}"; do
    [[ -d "packages/$p" ]] && args+=(-e "packages/$p")
done
uv pip install --quiet --python "$python" -r tests/xla/requirements.txt "${args[@]}" -e "packages/accel[xla]"
# What the extra installed must be a pair accel_xla accepts (importlib.metadata only: no torch import).
"$python" -c "from accel_xla.versions import check_installed_pair; check_installed_pair()"
echo "$python"
