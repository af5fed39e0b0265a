#!/usr/bin/env bash
# Build (or reuse) the floors environment: the accel packages, editable, with every extra that installs without a
# GPU, resolved under constraints.txt (the oldest versions the packages declare), on the oldest Python they declare
# (3.10) where this machine has one. Prints the interpreter's path last. Run the tests with tests/floors/run.sh.
#
# Why: the workspace's lock holds the newest versions, so the main suite cannot see a package that uses something
# newer than its declared floor (a session found torch 2.4 declared while 2.7's functions were called, and numpy
# 1.24's pickles refused). The environment lives under ACCEL_FLOORS_ENV (default $HOME/.cache/accel-ci/floors-env),
# kept between CI runs.
set -euo pipefail
cd "$(dirname "$0")/../.."

env_dir="${ACCEL_FLOORS_ENV:-$HOME/.cache/accel-ci/floors-env}"
venv="$env_dir/venv"
python="$venv/bin/python"

# The oldest Python accel declares (requires-python >=3.10): uv's own, or pyenv's, else the newest one uv finds.
floor_python="${ACCEL_FLOORS_PYTHON:-}"
if [[ -z "$floor_python" ]]; then
    floor_python="$(uv python find --no-python-downloads 3.10 2>/dev/null || true)"
fi
if [[ -z "$floor_python" ]]; then
    floor_python="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10 2>/dev/null | tail -n 1 || true)"
fi
if [[ -z "$floor_python" ]]; then
    echo "tests/floors/setup.sh: no Python 3.10 here; using uv's default (set ACCEL_FLOORS_PYTHON to choose)" >&2
    floor_python="3.11"
fi

mkdir -p "$env_dir"
if [[ ! -x "$python" ]] || ! cmp -s tests/floors/constraints.txt "$env_dir/constraints.txt"; then
    rm -rf "$venv"
    uv venv --quiet --no-python-downloads --python "$floor_python" "$venv"
fi
args=()
for p in packages/accel-*/; do
    [[ "$p" == packages/accel-data/ ]] || args+=(-e "${p%/}")
done
# Extras that install without a GPU: all but accel-fp8's `te` (Transformer-Engine) and accel-xla's `xla` pair.
uv pip install --quiet --python "$python" -c tests/floors/constraints.txt -r tests/floors/requirements.txt \
    "${args[@]}" -e "packages/accel[tracking,fsdp,deepspeed,megatron,fp8]" -e "packages/accel-data[stateful]"
cp tests/floors/constraints.txt "$env_dir/constraints.txt"
"$python" - <<'PY'
import importlib.metadata as m
names = ("torch", "numpy", "deepspeed", "megatron-core", "torchao")
print("floors environment:", ", ".join(f"{name} {m.version(name)}" for name in names))
PY
echo "$python"
