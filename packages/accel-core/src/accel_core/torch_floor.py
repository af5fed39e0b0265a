"""The oldest torch accel runs on, checked once torch is imported, so an older one fails with the fix.

pip and uv install a new enough torch through the packages' requirements (``torch>=2.9``); this check is
for the installs that skip them (``pip install --no-deps``, a torch from conda or a system image), where
the first failure would otherwise be an ImportError deep inside accel. CI's floors lane runs the fast lane on
torch 2.9 and the other declared minimum versions (tests/floors/constraints.txt).
"""

from __future__ import annotations

from packaging.version import Version

MIN_TORCH = "2.9"  # the same floor as every accel package's `torch>=` requirement (tests/packaging checks it)


def require_supported_torch(installed: str) -> None:
    """Raises ImportError naming the fix when ``installed`` (a ``torch.__version__``) is older than ``MIN_TORCH``."""
    if Version(Version(installed).base_version) < Version(MIN_TORCH):
        raise ImportError(
            f"accel needs torch>={MIN_TORCH}; this environment has torch {installed}. "
            f'Upgrade it: pip install "torch>={MIN_TORCH}" (with the index URL of your CUDA build if you use one).'
        )
