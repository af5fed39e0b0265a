"""Environment-variable helpers of the reference's ``accelerate.utils``: patch, clear, read. No torch import.

accel's own ``ACCEL_*`` variables are read in ``accel_core.environment``; these are the general
helpers user scripts and tests call.

Example::

    with patch_environment(master_port="29501", omp_num_threads=1):
        ...  # MASTER_PORT and OMP_NUM_THREADS are set here, restored afterwards
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from typing import Any, TypeVar, cast

_T = TypeVar("_T")

# The prefixes of the variables a launcher or a library sets for accel (and for the reference).
_ACCEL_PREFIXES = ("ACCEL_", "ACCELERATE_")


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """``1`` / ``0`` for a truth string (``y yes t true on 1`` / ``n no f false off 0``); ``True`` / ``False`` with
    ``to_bool``."""
    lowered = value.lower()
    if lowered in ("y", "yes", "t", "true", "on", "1"):
        return True if to_bool else 1
    if lowered in ("n", "no", "f", "false", "off", "0"):
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}: use one of y, yes, t, true, on, 1 or n, no, f, false, off, 0.")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """The boolean environment variable ``key`` (``default`` when unset)."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The environment variable ``key`` as it is (``default`` when unset)."""
    return os.environ.get(key, str(default))


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """The first non-negative integer among the variables ``env_keys``, else ``default``."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def are_libraries_initialized(*library_names: str) -> list[str]:
    """The names among ``library_names`` that are already imported."""
    return [name for name in library_names if name in sys.modules]


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """``["KEY=value\\n", ...]`` for the items safe to write into an environment file; warns about and skips the
    others."""
    forbidden = (";", "\n", "<", ">", " ")
    lines = []
    for key, value in current_env.items():
        if key and value and not any(char in key + value for char in forbidden):
            lines.append(f"{key}={value}\n")
        else:
            warnings.warn(f"Skipping {key}={value}: it contains forbidden characters or an empty part.", stacklevel=2)
    return lines


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Empties ``os.environ`` inside the block and restores it, exactly, afterwards."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Sets each keyword as an environment variable (key upper-cased, value ``str()``-ed) inside the block.

    On exit every patched variable gets its previous value back, or is removed if it had none.
    """
    previous: dict[str, str | None] = {}
    for key, value in kwargs.items():
        name = key.upper()
        previous.setdefault(name, os.environ.get(name))
        os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _restore_accel_variables() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(_ACCEL_PREFIXES)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(_ACCEL_PREFIXES)]:
            if key not in saved:
                del os.environ[key]
        os.environ.update(saved)


def purge_accelerate_environment(func_or_cls: _T) -> _T:
    """Decorator for a function or test class: ``ACCEL_*`` / ``ACCELERATE_*`` variables it sets are undone after each
    call.

    On a class, every ``test*`` method (of the class and of its subclasses) is wrapped.
    """

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _restore_accel_variables():
                return function(*args, **kwargs)

        wrapper._accel_purges_environment = True  # pyright: ignore[reportAttributeAccessIssue]  # a marker on the function
        return wrapper

    if not isinstance(func_or_cls, type):
        return cast(_T, wrap(cast("Callable[..., Any]", func_or_cls)))

    def wrap_tests(cls: type) -> type:
        for name in dir(cls):
            method = getattr(cls, name)
            if name.startswith("test") and callable(method) and not hasattr(method, "_accel_purges_environment"):
                setattr(cls, name, wrap(method))
        return cls

    wrap_tests(func_or_cls)
    # Subclasses defined later get their test methods wrapped too.
    func_or_cls.__init_subclass__ = classmethod(lambda cls, **kw: wrap_tests(cls))  # pyright: ignore[reportAttributeAccessIssue]
    return func_or_cls


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type)`` of this machine's accelerator, without initialising it.

    For example ``("cuda", "MULTI_GPU")``.

    The order of preference is the reference's: MLU, SDAA, MUSA, NPU, HPU, XPU, Neuron, then CUDA.
    """
    from . import availability as imports

    for kind, available in (
        ("mlu", imports.is_mlu_available),
        ("sdaa", imports.is_sdaa_available),
        ("musa", imports.is_musa_available),
        ("npu", imports.is_npu_available),
        ("hpu", imports.is_hpu_available),
        ("xpu", imports.is_xpu_available),
        ("neuron", imports.is_neuron_available),
    ):
        if available():
            return kind, f"MULTI_{kind.upper()}"
    return "cuda", "MULTI_GPU"
