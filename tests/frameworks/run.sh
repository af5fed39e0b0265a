#!/usr/bin/env bash
# Runs tests/frameworks in the frameworks' accel environment (built by tests/frameworks/setup.sh): transformers'
# Trainer, PEFT, TRL and diffusers on accel (the `accelerate` shim), each compared with the same run on Hugging Face's
# Accelerate in the reference environment, which the tests launch themselves. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
env_dir="${ACCEL_FRAMEWORKS_ENV:-$HOME/.cache/accel-ci/frameworks-env}"
python="$env_dir/accel/bin/python"
if [[ ! -x "$python" || ! -x "$env_dir/reference/bin/python" ]]; then
    echo "tests/frameworks/run.sh: no frameworks environments at $env_dir; build them with tests/frameworks/setup.sh" >&2
    exit 2
fi
# Nothing from a model hub: the tests build their models and tokenizers.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export ACCEL_FRAMEWORKS_REFERENCE_PYTHON="$env_dir/reference/bin/python"
# The rest of the suite lives in the main environment; here the runs on accel and on Accelerate (test_frameworks.py).
"$python" -m pytest -q -p no:cacheprovider --rootdir=. -c pyproject.toml tests/frameworks/test_frameworks.py "$@"
# The import scan: every accelerate name the frameworks installed here use must resolve under accel. Their sources
# are read from this environment; the names are resolved in the workspace's environment, which holds every accel
# package (this one leaves accel-deepspeed out: transformers takes other code paths when deepspeed is importable).
site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ACCEL_FRAMEWORKS_SITE="$site" uv run --locked pytest -q -p no:cacheprovider -s tests/frameworks/test_import_scan.py
