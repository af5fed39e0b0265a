"""Memory helpers: find a batch size that fits, and give memory back between two trainings.

Example::

    from accel.utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size, model):
        ...  # an out-of-memory error here retries with batch_size = int(batch_size * 0.9)

    train(model)
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

from . import availability as imports

# Messages of the allocation failures that a smaller batch can cure (the reference's list).
_OUT_OF_MEMORY_MESSAGES = (
    " out of memory.",  # CUDA, ROCm, XPU, NPU: "<DEVICE> out of memory. Tried to allocate ..."
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN's answer to a too-large batch
    "DefaultCPUAllocator: can't allocate memory",  # CPU
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empties the caching allocator of this machine's accelerator (and runs ``gc.collect()`` if asked; it is slow)."""
    if garbage_collection:
        gc.collect()
    for kind, available in (
        ("xpu", imports.is_xpu_available),
        ("mlu", imports.is_mlu_available),
        ("sdaa", imports.is_sdaa_available),
        ("musa", imports.is_musa_available),
        ("npu", imports.is_npu_available),
    ):
        if available():
            getattr(torch, kind).empty_cache()
            return
    if imports.is_mps_available(min_version="2.0"):
        torch.mps.empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drops the references to ``objects`` and empties the device cache; assign the result back.

    Example::

        model, optimizer = release_memory(model, optimizer)
    """
    released: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` is an out-of-memory error (of any device, or the CPU) that a smaller batch may avoid."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return any(message in exception.args[0] for message in _OUT_OF_MEMORY_MESSAGES)
    return False


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: calls ``function(batch_size, *args)`` and, on an out-of-memory error, again with a smaller batch.

    ``function`` takes the batch size as its first argument; callers do not pass it. The batch size
    starts at ``starting_batch_size`` and is multiplied by 0.9 after each failure (the reference's
    default; it halved before 1.8), or set to what ``reduce_batch_size_fn()`` returns. It stops with
    a RuntimeError at 0. A later call starts from the last size tried. Each process decides alone:
    give every process the same memory, or the processes may disagree on the batch size.

    Example::

        @find_executable_batch_size(starting_batch_size=128, reduce_batch_size_fn=lambda: 32)
        def train(batch_size): ...
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )

    batch_size = starting_batch_size

    def reduce_by_a_tenth() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn if reduce_batch_size_fn is not None else reduce_by_a_tenth

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) < len(args) + 1:
            passed = ", ".join(f"{name}={value}" for name, value in zip(parameters[1:], args[1:], strict=False))
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called. "
                f"Remove this as the decorator already does so: `{function.__name__}({passed})`"
            )
        while True:
            if batch_size <= 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            # Outside the except block: the error's traceback (and the failed attempt's tensors) is gone.
            clear_device_cache(garbage_collection=True)
            batch_size = reduce()

    return decorator
