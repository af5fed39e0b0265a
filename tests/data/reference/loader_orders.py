"""Records the sample order each process sees, epoch by epoch, for many loader settings.

Written as an Accelerate user writes a script, so it runs unchanged with Hugging Face Accelerate
or with accel (``--lib``). Run it on 2 processes::

    torchrun --nproc_per_node 2 tests/data/reference/loader_orders.py --lib accel --out orders.json

``accelerate_1_15_orders.json`` next to it was recorded with Accelerate 1.15.0 (torch 2.15, CPU,
gloo) in a throwaway environment outside the workspace (see ``record_reference.sh``);
``tests/data/test_reference_orders.py`` runs this script with accel and compares.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SubsetRandomSampler

EPOCHS = 3


class Indices(Dataset):
    """Sample ``i`` is ``i``; a list of indices (a loader whose sampler yields batches) gives a tensor of them."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Any) -> torch.Tensor:
        return torch.tensor(index)


# name -> settings. "kind": how the user builds the loader.
CASES: dict[str, dict[str, Any]] = {
    "shuffle_seed0": dict(seed=0, n=50, bs=4),
    "shuffle_seed42": dict(seed=42, n=50, bs=4),
    "shuffle_seed42_set_epoch": dict(seed=42, n=50, bs=4, set_epoch=True),
    "no_shuffle": dict(seed=0, n=50, bs=4, shuffle=False),
    "split_batches": dict(seed=1, n=50, bs=8, split_batches=True),
    "split_batches_uneven_tail": dict(seed=1, n=51, bs=8, split_batches=True),
    "split_batches_no_even": dict(seed=2, n=51, bs=8, split_batches=True, even_batches=False),
    "split_batches_no_even_tiny_tail": dict(seed=2, n=50, bs=8, split_batches=True, even_batches=False),
    "no_even_batches": dict(seed=3, n=50, bs=4, even_batches=False),
    "drop_last": dict(seed=4, n=50, bs=4, drop_last=True),
    "drop_last_split": dict(seed=4, n=50, bs=8, drop_last=True, split_batches=True),
    "seedable": dict(seed=5, n=50, bs=4, seedable=True),
    "seedable_set_epoch": dict(seed=5, n=50, bs=4, seedable=True, set_epoch=True),
    "seedable_data_seed": dict(seed=5, n=50, bs=4, seedable=True, data_seed=1234),
    "seedable_split_no_even": dict(seed=6, n=51, bs=8, seedable=True, split_batches=True, even_batches=False),
    "user_generator": dict(seed=7, n=50, bs=4, kind="generator"),
    "subset_random_sampler": dict(seed=8, n=50, bs=4, kind="subset"),
    "tiny_dataset": dict(seed=9, n=5, bs=4),
    "divisible": dict(seed=10, n=48, bs=4),
    "batch_sampler_as_sampler": dict(seed=11, n=50, bs=4, kind="batch_sampler"),
    "batch_sampler_as_sampler_drop_last": dict(seed=11, n=50, bs=4, kind="batch_sampler", drop_last=True),
    "batch_sampler_as_sampler_no_even": dict(seed=12, n=50, bs=4, kind="batch_sampler", even_batches=False),
    "batch_sampler_as_sampler_split": dict(seed=13, n=50, bs=4, kind="batch_sampler", split_batches=True),
    # Epoch 1 read through `accelerator.skip_first_batches(loader, 3)`, as resuming scripts do.
    "skip_first_batches": dict(seed=14, n=50, bs=4, skip=3),
    "skip_first_batches_seedable": dict(seed=14, n=50, bs=4, skip=3, seedable=True),
    "skip_first_batches_seedable_set_epoch": dict(seed=14, n=50, bs=4, skip=3, seedable=True, set_epoch=True),
    "skip_first_batches_batch_sampler": dict(seed=15, n=50, bs=4, skip=3, kind="batch_sampler"),
    # The user's own SeedableRandomSampler (as Accelerate's test_script builds it).
    "user_seedable_sampler": dict(seed=16, n=50, bs=4, kind="seedable"),
    "user_seedable_sampler_with_config": dict(seed=16, n=50, bs=4, kind="seedable", seedable=True),
    # Process 0 reads every batch and sends each process its share.
    "dispatch": dict(seed=17, n=50, bs=4, dispatch_batches=True),
    "dispatch_no_shuffle": dict(seed=17, n=50, bs=4, dispatch_batches=True, shuffle=False),
    "dispatch_split": dict(seed=18, n=50, bs=8, dispatch_batches=True, split_batches=True),
    "dispatch_seedable": dict(seed=19, n=50, bs=4, dispatch_batches=True, seedable=True),
    # Loops left early (early stopping): `stop[e]` batches of epoch e are read, then the loop breaks.
    # What the sampler drew before the break decides the next epoch's shuffle.
    "early_stop": dict(seed=20, n=50, bs=4, stop=[3, 1]),
    "early_stop_at_last_full_step": dict(seed=21, n=48, bs=4, stop=[5]),
    "early_stop_before_short_step": dict(seed=22, n=50, bs=4, stop=[6]),
    "early_stop_split": dict(seed=23, n=50, bs=8, split_batches=True, stop=[2, 2]),
    "early_stop_no_even": dict(seed=24, n=50, bs=4, even_batches=False, stop=[5]),
    "early_stop_seedable": dict(seed=25, n=50, bs=4, seedable=True, stop=[3]),
    "early_stop_generator": dict(seed=26, n=50, bs=4, kind="generator", stop=[3]),
    "early_stop_batch_sampler": dict(seed=27, n=48, bs=4, kind="batch_sampler", stop=[5]),
    "early_stop_skip_first_batches": dict(seed=28, n=50, bs=4, skip=3, stop=[None, 1]),
    "custom_batch_sampler": dict(seed=29, n=50, bs=4, kind="custom_batch_sampler"),
    "early_stop_custom_batch_sampler": dict(seed=30, n=48, bs=4, kind="custom_batch_sampler", stop=[5]),
}


class UserBatchSampler(BatchSampler):
    """A user's own batch sampler class (same batches as torch's)."""


def seedable_sampler_class(lib_name: str) -> type:
    # Accelerate has it in accelerate.data_loader; accel in accel.utils.
    return importlib.import_module(
        "accelerate.data_loader" if lib_name == "accelerate" else "accel.utils"
    ).SeedableRandomSampler


def build_loader(case: dict[str, Any], lib_name: str) -> DataLoader:
    dataset = Indices(case["n"])
    kind, bs, drop_last = case.get("kind", "loader"), case["bs"], case.get("drop_last", False)
    if kind == "loader":
        return DataLoader(dataset, batch_size=bs, shuffle=case.get("shuffle", True), drop_last=drop_last)
    if kind == "generator":
        generator = torch.Generator().manual_seed(123)
        return DataLoader(dataset, batch_size=bs, shuffle=True, drop_last=drop_last, generator=generator)
    if kind == "subset":  # a fold of a cross-validation: every other sample
        return DataLoader(dataset, batch_size=bs, sampler=SubsetRandomSampler(range(0, case["n"], 2)))
    if kind == "seedable":
        sampler = seedable_sampler_class(lib_name)(
            generator=torch.Generator().manual_seed(3), data_source=dataset, num_samples=len(dataset)
        )
        return DataLoader(dataset, batch_size=bs, sampler=sampler)
    if kind == "batch_sampler":
        sampler = BatchSampler(RandomSampler(dataset), batch_size=bs, drop_last=drop_last)
        return DataLoader(dataset, sampler=sampler, batch_size=None)
    if kind == "custom_batch_sampler":
        return DataLoader(
            dataset, batch_sampler=UserBatchSampler(RandomSampler(dataset), batch_size=bs, drop_last=drop_last)
        )
    raise ValueError(kind)


def run_case(lib: Any, case: dict[str, Any]) -> list[list[list[int]]] | str:
    """Each epoch's batches on this process, or the name of the error preparing or reading it raised."""
    config = lib.DataLoaderConfiguration(
        split_batches=case.get("split_batches", False),
        dispatch_batches=case.get("dispatch_batches"),
        even_batches=case.get("even_batches", True),
        use_seedable_sampler=case.get("seedable", False),
        data_seed=case.get("data_seed"),
    )
    accelerator = lib.Accelerator(cpu=True, dataloader_config=config)
    lib.utils.set_seed(case["seed"])
    try:
        loader = accelerator.prepare(build_loader(case, lib.__name__))
    except Exception as error:  # noqa: BLE001 - the error type is part of the behaviour compared
        return type(error).__name__
    epochs = []
    for epoch in range(EPOCHS):
        if case.get("set_epoch"):
            loader.set_epoch(epoch)
        active = loader
        if case.get("skip") and epoch == 1:
            active = accelerator.skip_first_batches(loader, case["skip"])
        batches = []
        stops = case.get("stop", [])
        stop = stops[epoch] if epoch < len(stops) else None
        for batch in active:
            batches.append(batch.reshape(-1).tolist())
            torch.rand(2)  # the training step draws from the global RNG (dropout) as a real one would
            if len(batches) == stop:
                break
        epochs.append(batches)
    return epochs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", choices=["accel", "accelerate"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", nargs="*", default=None)
    args = parser.parse_args()
    lib = importlib.import_module(args.lib)
    importlib.import_module(f"{args.lib}.utils")
    results: dict[str, Any] = {}
    for name in args.cases or CASES:
        mine = run_case(lib, CASES[name])
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        results[name] = {"settings": CASES[name], "orders": everyone}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            header = {"library": f"{args.lib} {lib.__version__}", "torch": torch.__version__}
            header.update(epochs=EPOCHS, processes=dist.get_world_size(), cases=results)
            json.dump(header, f)
            f.write("\n")
    dist.barrier()


if __name__ == "__main__":
    main()
