#!/usr/bin/env bash
# Build (or reuse) the two environments of the frameworks tests (tests/frameworks/run.sh runs them):
# - accel:     the workspace's accel packages (editable), the `accelerate` shim (packages/accelerate, editable: accel
#              under Accelerate's name), and transformers, TRL, PEFT, diffusers (requirements.txt);
# - reference: the same frameworks with Hugging Face's `accelerate==1.15.0`, the release the shim answers for.
# Both take uv.lock's versions of what the workspace also holds (torch, transformers, datasets...): the two differ only
# in what answers `import accelerate`. CPU only, nothing from a model hub (the tests build tiny models from configs).
#
# The environments live under ACCEL_FRAMEWORKS_ENV (default $HOME/.cache/accel-ci/frameworks-env), kept between CI
# runs; each is made anew when its inputs change (requirements.txt, uv.lock's versions, the Python), else only
# checked and the editable accel packages reinstalled. Prints the two interpreters' paths last.
set -euo pipefail
cd "$(dirname "$0")/../.."

env_dir="${ACCEL_FRAMEWORKS_ENV:-$HOME/.cache/accel-ci/frameworks-env}"
reference_accelerate="accelerate==1.15.0"
mkdir -p "$env_dir"

# uv.lock's versions of the third-party packages, as constraints (the same export tests/packaging uses).
constraints="$env_dir/constraints.txt.new"
uv export --frozen --all-packages --no-hashes --no-emit-workspace --no-header --no-annotate -q -o "$constraints"
python_version="$(uv run --frozen --no-sync python -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# The accel distributions a frameworks user installs: the meta-package with the FSDP backend (transformers' Trainer
# imports the FSDP checkpoint helpers), not DeepSpeed (transformers switches code paths when deepspeed is importable;
# neither environment has it).
accel_args=()
for p in accel-core accel-data accel-checkpoint accel-tracking accel-launch accel-fsdp; do
    accel_args+=(-e "packages/$p")
done
accel_args+=(-e "packages/accel[fsdp]" -e "packages/accelerate")

build() {
    local name="$1"
    shift
    local venv="$env_dir/$name"
    local inputs
    inputs="$(cat tests/frameworks/requirements.txt "$constraints"; echo "python $python_version"; echo "$*")"
    # A kept environment is only checked: its bytecode is there already (UV_COMPILE_BYTECODE, which .ci/run sets,
    # would compile all of site-packages again at each install: a minute and a half of CPU for nothing).
    local uv_pip=(env -u UV_COMPILE_BYTECODE uv pip)
    if [[ ! -x "$venv/bin/python" ]] || [[ "$inputs" != "$(cat "$env_dir/$name.inputs" 2>/dev/null)" ]]; then
        rm -rf "$venv" "$env_dir/$name.inputs"
        uv venv --quiet --python "$python_version" "$venv"
        uv_pip=(uv pip)
    fi
    "${uv_pip[@]}" install --quiet --python "$venv/bin/python" -c "$constraints" \
        -r tests/frameworks/requirements.txt "$@"
    echo "$inputs" >"$env_dir/$name.inputs"
}

build accel "${accel_args[@]}"
build reference "$reference_accelerate"
mv "$constraints" "$env_dir/constraints.txt"

# What each holds (package metadata only: no import), and that the accel environment has no Hugging Face Accelerate.
for name in accel reference; do
    "$env_dir/$name/bin/python" - "$name" <<'PY'
import importlib.metadata as m
import sys
names = ("torch", "transformers", "trl", "peft", "diffusers", "accelerate")
print(f"frameworks environment {sys.argv[1]}:", ", ".join(f"{n} {m.version(n)}" for n in names))
PY
done
"$env_dir/accel/bin/python" -c 'import importlib.metadata as m; v = m.version("accelerate"); assert v.endswith("+accel.0.1.0"), v'
echo "$env_dir/accel/bin/python"
echo "$env_dir/reference/bin/python"
