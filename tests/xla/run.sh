#!/usr/bin/env bash
# Runs tests/xla in the XLA environment (built by tests/xla/setup.sh) on XLA's CPU device, one replica.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
env_dir="${ACCEL_XLA_ENV:-$HOME/.cache/accel-ci/xla-env}"
python="$env_dir/venv/bin/python"
if [[ ! -x "$python" ]]; then
    echo "tests/xla/run.sh: no XLA environment at $env_dir; build it with tests/xla/setup.sh" >&2
    exit 2
fi
export PJRT_DEVICE=CPU
# The rest of the suite lives in the main environment; here only tests/xla (its own conftest and pytest settings).
exec "$python" -m pytest -q -p no:cacheprovider --rootdir=. -c pyproject.toml tests/xla "$@"
