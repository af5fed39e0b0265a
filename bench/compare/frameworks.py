"""One training-loop vocabulary over accel, Hugging Face Accelerate, Lightning Fabric and raw PyTorch.

Each scenario is written once against `Harness`; each subclass does what that framework's documentation
shows (Accelerate's `accumulate` + `sync_gradients`, Fabric's `no_backward_sync` + `clip_gradients`, DDP's
`no_sync` by hand). This module runs inside every framework's own environment, so it imports a framework
only in that framework's class.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

FRAMEWORKS = ("accel", "raw", "accelerate", "fabric")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


class Harness:
    """What a scenario asks of a framework; `name` is one of FRAMEWORKS."""

    name = ""

    def __init__(self, grad_accum: int = 1, strategy: str | None = None) -> None:
        self.grad_accum = grad_accum
        self.micro = 0  # micro-steps taken, for the frameworks where the loop counts them itself

    rank = 0
    world = 1

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> tuple:
        raise NotImplementedError

    def loader(self, dataset, batch_size: int, shuffle: bool, dispatch: bool = False) -> Any:
        """A loader sharded over the processes (`dispatch`: process 0 reads and sends; None where unsupported)."""
        raise NotImplementedError

    def train_step(self, model, optimizer, scheduler, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One micro-step: forward, backward, and on the last of `grad_accum` clip + step + schedule."""
        raise NotImplementedError

    def gather_eval(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def save(self, path: str, model, optimizer, scheduler) -> None:
        raise NotImplementedError

    def load(self, path: str, model, optimizer, scheduler) -> None:
        raise NotImplementedError

    def skip(self, loader, batches: int) -> Any:
        """The loader to iterate for the rest of an epoch resumed after `batches` (framework's own recipe)."""
        raise NotImplementedError

    def start_epoch(self, loader, epoch: int) -> None:
        """What the framework's documented loop calls at the start of each epoch (nothing by default)."""

    def barrier(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def unwrap(self, model) -> torch.nn.Module:
        return getattr(model, "module", model)


class _AcceleratorHarness(Harness):
    """accel and Accelerate share the `Accelerator` API; only the import differs."""

    package = ""

    def __init__(self, grad_accum: int = 1, strategy: str | None = None) -> None:
        super().__init__(grad_accum)
        module = __import__(self.package)
        self.lib = module
        kwargs: dict[str, Any] = {}
        if strategy == "fsdp2":
            kwargs["fsdp_plugin"] = module.FullyShardedDataParallelPlugin(
                fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
            )
        elif strategy == "zero3":
            plugin = module.DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0)
            plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 32  # no loader is prepared with the model
            # Buckets sized from the model's `config.hidden_size` as both fill "auto" for a transformers model;
            # DeepSpeed's fixed defaults (5e8-element buckets, 2 GB) would dwarf the benchmark's model.
            buckets = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
            plugin.deepspeed_config["zero_optimization"].update(dict.fromkeys(buckets, "auto"))
            kwargs["deepspeed_plugin"] = plugin
        self.acc = module.Accelerator(cpu=True, gradient_accumulation_steps=grad_accum, **kwargs)
        self.rank, self.world = self.acc.process_index, self.acc.num_processes

    def prepare(self, model, optimizer, scheduler=None):
        if scheduler is None:
            return (*self.acc.prepare(model, optimizer), None)
        return self.acc.prepare(model, optimizer, scheduler)

    def _prepare_data_loader(self):
        raise NotImplementedError

    def loader(self, dataset, batch_size, shuffle, dispatch=False):
        base = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
        if not dispatch:
            return self.acc.prepare(base)
        return self._prepare_data_loader()(
            base,
            self.acc.device,
            num_processes=self.world,
            process_index=self.rank,
            put_on_device=True,
            dispatch_batches=True,
        )

    def train_step(self, model, optimizer, scheduler, x, y):
        with self.acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            self.acc.backward(loss)
            if self.acc.sync_gradients:
                self.acc.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
        return loss

    def gather_eval(self, logits, labels):
        return self.acc.gather_for_metrics((logits, labels))

    def save(self, path, model, optimizer, scheduler):
        self.acc.save_state(path)

    def load(self, path, model, optimizer, scheduler):
        self.acc.load_state(path)

    def barrier(self):
        self.acc.wait_for_everyone()

    def unwrap(self, model):
        return self.acc.unwrap_model(model)


class AccelHarness(_AcceleratorHarness):
    name, package = "accel", "accel"

    def _prepare_data_loader(self):
        from accel import prepare_data_loader

        return prepare_data_loader

    def skip(self, loader, batches):
        return loader  # load_state restores the prepared loader's position itself

    def save_async(self, path: str) -> None:
        self.acc.save_state(path, async_save=True)

    def wait_async(self) -> None:
        from accel_checkpoint import wait_for_checkpoint

        wait_for_checkpoint(self.acc)


class AccelerateHarness(_AcceleratorHarness):
    name, package = "accelerate", "accelerate"

    def _prepare_data_loader(self):
        from accelerate.data_loader import prepare_data_loader

        return prepare_data_loader

    def skip(self, loader, batches):
        return self.acc.skip_first_batches(loader, batches) if batches else loader


class FabricHarness(Harness):
    name = "fabric"

    def __init__(self, grad_accum: int = 1, strategy: str | None = None) -> None:
        super().__init__(grad_accum)
        from lightning_fabric import Fabric

        world = world_size()
        chosen: Any = "ddp" if world > 1 else "auto"
        if strategy == "fsdp2":
            from lightning_fabric.strategies import FSDPStrategy

            chosen = FSDPStrategy()
        elif strategy == "zero3":
            chosen = "deepspeed_stage_3"
        self.fabric = Fabric(accelerator="cpu", devices=world, strategy=chosen)
        # Under `fabric run` the CLI has created the processes and Fabric refuses a second `launch()` (RuntimeError:
        # "launched through the CLI"); its docs call launch() only in scripts started by `python` or torchrun.
        if os.environ.get("LT_CLI_USED") != "1":
            self.fabric.launch()
        self.rank, self.world = self.fabric.global_rank, self.fabric.world_size

    def prepare(self, model, optimizer, scheduler=None):
        model, optimizer = self.fabric.setup(model, optimizer)
        return model, optimizer, scheduler

    def loader(self, dataset, batch_size, shuffle, dispatch=False):
        if dispatch:
            return None
        return self.fabric.setup_dataloaders(DataLoader(dataset, batch_size=batch_size, shuffle=shuffle))

    def train_step(self, model, optimizer, scheduler, x, y):
        self.micro += 1
        accumulating = self.micro % self.grad_accum != 0
        with self.fabric.no_backward_sync(model, enabled=accumulating):
            loss = torch.nn.functional.mse_loss(model(x), y)
            self.fabric.backward(loss / self.grad_accum)
        if not accumulating:
            self.fabric.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
        return loss

    def gather_eval(self, logits, labels):
        gathered = self.fabric.all_gather((logits, labels))
        if self.world == 1:
            return gathered
        return tuple(t.reshape(-1, *t.shape[2:]) for t in gathered)

    def _state(self, model, optimizer, scheduler) -> dict:
        state: dict[str, Any] = {"model": model, "optimizer": optimizer}
        if scheduler is not None:
            state["scheduler"] = scheduler
        return state

    def save(self, path, model, optimizer, scheduler):
        self.fabric.save(path, self._state(model, optimizer, scheduler))

    def load(self, path, model, optimizer, scheduler):
        self.fabric.load(path, self._state(model, optimizer, scheduler))

    def skip(self, loader, batches):
        import itertools

        return itertools.islice(loader, batches, None)  # Fabric has no skip helper: the loop skips by hand

    def barrier(self):
        self.fabric.barrier()


class RawHarness(Harness):
    """Hand-written torch.distributed: DDP, DistributedSampler, no_sync, clip_grad_norm_, all_gather; FSDP2 as
    `fully_shard` by hand; ZeRO-3 as DeepSpeed used directly (`deepspeed.initialize`, `engine.backward`,
    `engine.step`): ZeRO-3 by hand is DeepSpeed's own API, with the config accel builds for its ZeRO-3 run."""

    name = "raw"

    def __init__(self, grad_accum: int = 1, strategy: str | None = None) -> None:
        super().__init__(grad_accum)
        self.strategy = strategy
        self.world = world_size()
        self.ds_config: dict[str, Any] | None = None
        if strategy == "zero3" and not dist.is_initialized():
            # DeepSpeed's own start: joins torchrun's group over its accelerator's backend (gloo on the CPU). The
            # benchmark runs on the CPU, as accel's `cpu=True` does; DS_ACCELERATOR is read at deepspeed's import.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            import deepspeed

            deepspeed.init_distributed()
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("gloo")
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.epoch = 0

    def prepare(self, model, optimizer, scheduler=None):
        if self.strategy == "fsdp2":  # fully_shard by hand: each Block, then the root
            from torch.distributed.fsdp import fully_shard

            for module in model.modules():
                if type(module).__name__ == "Block":
                    fully_shard(module)
            fully_shard(model)
            sharded, start = list(model.parameters()), 0  # fully_shard swapped the parameters, in the same order
            for group in optimizer.param_groups:
                group["params"], start = sharded[start : start + len(group["params"])], start + len(group["params"])
        elif self.strategy == "zero3":
            import deepspeed

            self.ds_config = self.zero3_config(model)
            model, optimizer, _, engine_scheduler = deepspeed.initialize(
                model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config
            )
            return model, optimizer, engine_scheduler
        elif self.world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        return model, optimizer, scheduler

    def loader(self, dataset, batch_size, shuffle, dispatch=False):
        if dispatch:
            return None
        if self.world == 1:
            return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
        sampler = torch.utils.data.DistributedSampler(dataset, shuffle=shuffle)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler)

    def zero3_config(self, model: torch.nn.Module) -> dict[str, Any]:
        """The DeepSpeed config a user writes by hand for the benchmark's ZeRO-3 run: the one accel's harness ends up
        with once accel-deepspeed has filled its "auto" values (bench/zero3_step.py compares the two)."""
        hidden = model.config.hidden_size  # pyright: ignore[reportAttributeAccessIssue] - set by the scenario
        return {
            "train_batch_size": 32 * self.grad_accum * self.world,
            "train_micro_batch_size_per_gpu": 32,
            "gradient_accumulation_steps": self.grad_accum,
            "gradient_clipping": 1.0,
            "steps_per_print": 10**12,  # no progress lines, as accel's config
            "zero_allow_untested_optimizer": True,  # a torch AdamW, not one of DeepSpeed's
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "none"},
                "offload_param": {"device": "none"},
                "stage3_gather_16bit_weights_on_model_save": False,
                # What accel-deepspeed fills "auto" with for a model of this width (as Accelerate and transformers
                # do); DeepSpeed's fixed defaults (5e8-element buckets) would dwarf the benchmark's model.
                "reduce_bucket_size": hidden * hidden,
                "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "stage3_param_persistence_threshold": 10 * hidden,
            },
        }

    def train_step(self, model, optimizer, scheduler, x, y):
        if self.strategy == "zero3":
            # DeepSpeed's loop: the engine divides by the accumulation steps, reduces, and at its own boundary (every
            # grad_accum micro-steps) clips to the config's gradient_clipping, steps, zeroes and schedules.
            loss = torch.nn.functional.mse_loss(model(x), y)
            model.backward(loss)
            model.step()
            return loss
        self.micro += 1
        accumulating = self.micro % self.grad_accum != 0
        no_sync = model.no_sync() if accumulating and self.world > 1 and not self.strategy else contextlib.nullcontext()
        if self.strategy == "fsdp2":  # FSDP2's own switch: no reduce-scatter while accumulating (as torchtitan does)
            model.set_requires_gradient_sync(not accumulating)
        with no_sync:
            loss = torch.nn.functional.mse_loss(model(x), y)
            (loss / self.grad_accum).backward()
        if not accumulating:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
        return loss

    def gather_eval(self, logits, labels):
        if self.world == 1:
            return logits, labels
        out = []
        for t in (logits, labels):
            parts = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(parts, t.contiguous())
            out.append(torch.cat(parts))
        return tuple(out)

    def save(self, path, model, optimizer, scheduler):
        # What a careful hand-written loop saves: weights, optimizer, schedule and the RNG streams.
        if self.rank == 0:
            state = {
                "model": self.unwrap(model).state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": torch.get_rng_state(),
            }
            if scheduler is not None:
                state["scheduler"] = scheduler.state_dict()
            torch.save(state, path)
        rngs = [None] * self.world
        if self.world > 1:
            dist.all_gather_object(rngs, torch.get_rng_state())
            if self.rank == 0:
                torch.save(rngs, path + ".rng")
        self.barrier()

    def load(self, path, model, optimizer, scheduler):
        state = torch.load(path, weights_only=True)
        self.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        rng = torch.load(path + ".rng", weights_only=True)[self.rank] if self.world > 1 else state["rng"]
        torch.set_rng_state(rng)

    def skip(self, loader, batches):
        import itertools

        return itertools.islice(loader, batches, None)

    def start_epoch(self, loader, epoch):
        if self.world > 1:
            loader.sampler.set_epoch(epoch)  # DistributedSampler's documented requirement


HARNESSES: dict[str, type[Harness]] = {
    "accel": AccelHarness,
    "accelerate": AccelerateHarness,
    "fabric": FabricHarness,
    "raw": RawHarness,
}


def make(name: str, grad_accum: int = 1, strategy: str | None = None) -> Harness:
    """The harness of framework `name`; `strategy` "fsdp2" or "zero3" shards the model (None: DDP)."""
    return HARNESSES[name](grad_accum, strategy)
