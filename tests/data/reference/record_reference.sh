#!/usr/bin/env bash
# Records accelerate_1_15_orders.json with Hugging Face Accelerate 1.15 on 2 CPU processes, in a
# throwaway environment outside the workspace (Accelerate is never a dependency of accel).
# Run from the repository root: bash tests/data/reference/record_reference.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${ACCEL_REFERENCE_VENV:-/tmp/accelerate-1.15-reference}"
torch_version="$(uv run python -c 'import torch; print(torch.__version__.split("+")[0])')"
if [ ! -x "$venv/bin/python" ]; then
    uv venv -q "$venv" --python "$(uv run python -c 'import sys; print(sys.executable)')"
    VIRTUAL_ENV="$venv" uv pip install -q "accelerate==1.15.*" "torch==$torch_version"
fi
OMP_NUM_THREADS=1 "$venv/bin/python" -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 \
    --master_port 29731 "$here/loader_orders.py" --lib accelerate --out "$here/accelerate_1_15_orders.json"
"$venv/bin/python" -c 'import accelerate, torch; print("recorded with accelerate", accelerate.__version__, "torch", torch.__version__)'
