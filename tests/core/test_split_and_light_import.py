"""split_between_processes arithmetic for every small case, and the import cost rules."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import accel_core
from accel_core.state.splitting import split_inputs as _split

VERSION = re.escape(accel_core.__version__)  # the hints pin accel's own release


@pytest.mark.parametrize("processes", [1, 2, 3, 4])
@pytest.mark.parametrize("length", range(0, 10))
def test_split_covers_every_item_once_in_order(processes, length):
    items = list(range(length))
    shares = [_split(items, processes, i, apply_padding=False) for i in range(processes)]
    assert [x for share in shares for x in share] == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    padded = [_split(items, processes, i, apply_padding=True) for i in range(processes)]
    if length:
        assert len({len(share) for share in padded}) == 1, "padding evens the shares"
    tensor_shares = [_split(torch.tensor(items), processes, i, apply_padding=False) for i in range(processes)]
    assert torch.cat(tensor_shares).tolist() == items if processes > 1 else True


def test_padding_repeats_the_inputs_last_item():
    """As Accelerate: a short share is completed with the input's last item, not its own."""
    items = list(range(7))
    assert [_split(items, 3, i, apply_padding=True) for i in range(3)] == [[0, 1, 2], [3, 4, 6], [5, 6, 6]]
    padded = [_split(torch.arange(7), 3, i, apply_padding=True).tolist() for i in range(3)]
    assert padded == [[0, 1, 2], [3, 4, 6], [5, 6, 6]]


@pytest.mark.parametrize("processes", [2, 3])
def test_split_a_datasets_dataset_gives_its_rows(processes):
    datasets = pytest.importorskip("datasets")
    for length in range(0, 8):
        table = datasets.Dataset.from_dict({"idx": list(range(length)), "text": [f"t{i}" for i in range(length)]})
        shares = [_split(table, processes, i, apply_padding=False) for i in range(processes)]
        assert all(isinstance(share, datasets.Dataset) for share in shares), "rows, not a dict of columns"
        assert [i for share in shares for i in share["idx"]] == list(range(length))
        assert [t for share in shares for t in share["text"]] == [f"t{i}" for i in range(length)]
        padded = [_split(table, processes, i, apply_padding=True) for i in range(processes)]
        assert [share["idx"] for share in padded] == [
            _split(list(range(length)), processes, i, True) for i in range(processes)
        ]
    nested = _split({"rows": datasets.Dataset.from_dict({"idx": [0, 1, 2]}), "ids": [0, 1, 2]}, 2, 1, False)
    assert nested["rows"]["idx"] == nested["ids"] == [2]


def test_import_accel_does_not_import_torch():
    code = "import sys, accel, accel_core, accel_core.environment, accel_core.discovery; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_public_names_resolve():
    import accel
    import accel.utils

    for name in ("Accelerator", "PartialState", "DistributedType", "ProjectConfiguration", "DataLoaderConfiguration"):
        assert getattr(accel, name) is not None
    for name in ("gather", "reduce", "broadcast", "pad_across_processes", "send_to_device", "set_seed"):
        assert callable(getattr(accel.utils, name))


def test_backend_names_resolve_and_a_missing_provider_names_the_extra():
    import accel
    import accel.utils
    from accel_core.lazy import lazy_exports

    assert accel.DeepSpeedPlugin.__module__.startswith("accel_deepspeed")
    assert accel.FullyShardedDataParallelPlugin.__module__.startswith("accel_fsdp")
    assert accel.utils.DummyOptim is not None and accel.utils.DummyScheduler is not None
    getattr_, _ = lazy_exports({"__name__": "demo"}, {"IPUPlugin": "accel_ipu"})  # no such distribution
    with pytest.raises(
        ImportError,
        match=rf'IPUPlugin comes from accel-ipu, which is not installed: pip install "accel\[ipu\]=={VERSION}"',
    ):
        getattr_("IPUPlugin")


def test_a_misspelt_backend_or_tracker_name_is_answered_with_the_closest_one() -> None:
    from accel_core import discovery

    assert (
        discovery.install_hint("accel.trackers", "tensorbord") == "no package provides it (did you mean 'tensorboard')"
    )
    assert discovery.install_hint("accel.strategies", "fdsp") == "no package provides it (did you mean 'fsdp')"
    assert discovery.install_hint("accel.strategies", "horovod") == "install the package that provides it"
    assert discovery.install_hint("accel.strategies", "deepspeed").startswith("pip install")
