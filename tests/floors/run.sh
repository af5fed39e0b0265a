#!/usr/bin/env bash
# Runs the fast lane (`-m "not slow"`) in the floors environment (tests/floors/setup.sh): accel on the oldest
# versions it declares. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
env_dir="${ACCEL_FLOORS_ENV:-$HOME/.cache/accel-ci/floors-env}"
python="$env_dir/venv/bin/python"
if [[ ! -x "$python" ]]; then
    echo "tests/floors/run.sh: no floors environment at $env_dir; build it with tests/floors/setup.sh" >&2
    exit 2
fi
# Deselected here, with the reason:
# - fp8 training on the CPU: torch 2.7 has no CPU kernel for torch._scaled_mm (the main suite trains fp8 on the
#   CPU with the workspace's torch); on the floors, conversion and configuration are checked, not the matmul.
exec "$python" -m pytest -q -p no:cacheprovider -m "not slow" \
    --deselect tests/fp8/test_fp8_single.py::test_float8_linear_trains_on_cpu \
    --deselect tests/fp8/test_fp8_single.py::test_prepared_fp8_model_state_dict_is_plain_and_reloads \
    "$@"
