"""ZeRO-1, ZeRO-2 (accumulation + clipping), ZeRO-3 (plain and zero.Init) and bf16 against DDP, in one 2-process launch.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/deepspeed/zero_checks.py <tmp_dir>
Each ``@check`` is one test of test_deepspeed_runs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import ds_testlib as T
import torch
import torch.distributed as dist
from checklist import check, expect, run_checks

from accel_core import Accelerator, DistributedType
from accel_deepspeed import DeepSpeedPlugin
from accel_deepspeed.wrappers import DeepSpeedOptimizerWrapper

TMP = Path(sys.argv[1])
FIGURES: dict[str, object] = {}


def loader(dataset: torch.utils.data.Dataset) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_size=T.BATCH, shuffle=False)


def run(
    plugin: DeepSpeedPlugin, make_model=T.mlp, dataset=None, loss_fn=T.regression_loss, clip=None, **accelerator_kwargs
):
    accelerator = Accelerator(deepspeed_plugin=plugin, **accelerator_kwargs)
    with accelerator.strategy.zero3_init_context():
        model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=T.LR)
    engine, optimizer, train_loader = accelerator.prepare(model, optimizer, loader(dataset or T.regression_data()))
    losses, batches = T.train_accel(accelerator, engine, optimizer, train_loader, loss_fn=loss_fn, clip=clip)
    return accelerator, engine, optimizer, losses, batches


@check
def setup_and_zero1() -> None:
    from deepspeed.accelerator import get_accelerator

    accelerator, engine, optimizer, losses, batches = run(DeepSpeedPlugin(zero_stage=1))
    expect(accelerator.num_processes == 2 and dist.get_backend() == "gloo", "2 gloo processes expected")
    expect(
        accelerator.distributed_type == DistributedType.DEEPSPEED, f"distributed_type {accelerator.distributed_type}"
    )
    expect(get_accelerator()._name == "cpu", f"DeepSpeed picked {get_accelerator()._name}, not its CPU accelerator")
    expect(type(engine).__name__ == "DeepSpeedEngine" and engine.zero_optimization_stage() == 1, "a ZeRO-1 engine")
    expect(isinstance(optimizer, DeepSpeedOptimizerWrapper), f"optimizer wrapper: {type(optimizer)}")
    expect(accelerator.unwrap_model(engine) is engine.module, "unwrap_model gives the user's module")
    config = accelerator.strategy.deepspeed_config
    expect(
        config["train_micro_batch_size_per_gpu"] == T.BATCH and config["train_batch_size"] == 2 * T.BATCH,
        f"batch autos: {config}",
    )
    # ZeRO-1 keeps half of the fp32 master weights / Adam state on each rank.
    total = sum(p.numel() for p in engine.module.parameters())
    mine = sum(p.numel() for p in engine.optimizer.single_partition_of_fp32_groups)
    expect(abs(mine - total / 2) <= 16, f"ZeRO-1 partition holds {mine} of {total} parameters")
    reference, _, _ = T.train_ddp(T.mlp, batches)
    expect(T.close(losses, reference, 1e-4, 1e-5), f"ZeRO-1 losses {losses} vs DDP {reference}")
    expect(losses[-1] < losses[0], "ZeRO-1 loss decreases")
    FIGURES["zero1_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


@check
def zero2_accumulation_clipping() -> None:
    plugin = DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0)
    _accelerator, engine, _optimizer, losses, batches = run(plugin, clip=1.0, gradient_accumulation_steps=2)
    expect(
        engine.zero_optimization_stage() == 2 and engine.gradient_accumulation_steps() == 2,
        "ZeRO-2 with 2 accumulation steps",
    )
    expect(
        engine.global_steps == len(batches) // 2,
        f"engine stepped {engine.global_steps} times over {len(batches)} micro-steps",
    )
    clipped, norms, _ = T.train_ddp(T.mlp, batches, accumulation=2, clip=1.0)
    unclipped, _, _ = T.train_ddp(T.mlp, batches, accumulation=2)
    expect(
        max(norms) > 1.5, f"gradient norms {norms} should exceed the clipping threshold for this check to mean anything"
    )
    expect(T.close(losses, clipped, 1e-4, 1e-5), f"ZeRO-2 (accumulate 2, clip 1.0) losses {losses} vs DDP {clipped}")
    expect(not T.close(losses, unclipped, 1e-3, 1e-4), "ZeRO-2 should differ from unclipped DDP: clipping not applied?")
    FIGURES["zero2_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, clipped, strict=True))


def zero3_config() -> dict:
    """A config dict with "auto" values; persistence threshold 0 so even this small model is partitioned."""
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }


@check
def zero3() -> None:
    accelerator, engine, _optimizer, losses, batches = run(DeepSpeedPlugin(hf_ds_config=zero3_config()))
    expect(engine.zero_optimization_stage() == 3, "a ZeRO-3 engine")
    weight = engine.module[2].weight
    expect(
        weight.numel() == 0 and weight.ds_tensor.numel() == math.ceil(weight.ds_numel / 2),
        "ZeRO-3 parameters are partitioned",
    )
    reference, _, _ = T.train_ddp(T.mlp, batches)
    expect(T.close(losses, reference, 1e-4, 1e-5), f"ZeRO-3 losses {losses} vs DDP {reference}")
    FIGURES["zero3_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
    try:
        accelerator.get_state_dict(engine)
    except ValueError as error:
        expect("stage3_gather_16bit_weights_on_model_save" in str(error), f"error should name the switch: {error}")
    else:
        raise AssertionError("get_state_dict under ZeRO-3 without the gather switch must raise")


@check
def zero3_init_and_consolidated_state_dict() -> None:
    plugin = DeepSpeedPlugin(hf_ds_config=zero3_config(), zero3_init_flag=True, zero3_save_16bit_model=True)
    accelerator = Accelerator(deepspeed_plugin=plugin)
    with accelerator.strategy.zero3_init_context():
        model = T.mlp()
    expect(
        all(hasattr(p, "ds_id") and p.numel() == 0 for p in model.parameters()),
        "zero.Init builds the model partitioned",
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=T.LR)
    engine, optimizer, train_loader = accelerator.prepare(model, optimizer, loader(T.regression_data()))
    losses, batches = T.train_accel(accelerator, engine, optimizer, train_loader)
    reference, _, _ = T.train_ddp(T.mlp, batches)
    expect(T.close(losses, reference, 1e-4, 1e-5), f"ZeRO-3 + zero.Init losses {losses} vs DDP {reference}")
    single = T.train_single_process(T.mlp, batches).state_dict()
    state = accelerator.get_state_dict(engine)
    from_module = accelerator.get_state_dict(accelerator.unwrap_model(engine))  # the user's module works too
    if accelerator.is_main_process:
        expect(
            all(torch.equal(from_module[k], state[k]) for k in state),
            "get_state_dict of the unwrapped module gathers too",
        )
        expect(sorted(state) == sorted(single), f"consolidated keys {sorted(state)}")
        worst = max(float((state[k] - single[k]).abs().max()) for k in single)
        expect(worst < 1e-4, f"consolidated ZeRO-3 weights differ from one process's by {worst}")
        FIGURES["zero3_consolidated_max_abs_diff"] = worst
    else:
        expect(state == {}, "other ranks get an empty dict")
    accelerator.save_model(engine, TMP / "zero3_model")
    if accelerator.is_main_process:
        from safetensors.torch import load_file

        saved = load_file(str(TMP / "zero3_model" / "model.safetensors"))
        expect(all(torch.equal(saved[k], state[k]) for k in state), "save_model writes the consolidated weights")
    accelerator.wait_for_everyone()


@check
def bf16() -> None:
    plugin = DeepSpeedPlugin(zero_stage=2)
    accelerator, engine, _optimizer, losses, batches = run(
        plugin, make_model=T.TokenClassifier, dataset=T.token_data(), loss_fn=T.token_loss, mixed_precision="bf16"
    )
    expect(accelerator.mixed_precision == "bf16" and accelerator.state.mixed_precision == "bf16", "bf16 reported")
    expect(engine.module.embed.weight.dtype == torch.bfloat16, "DeepSpeed computes in bf16")
    masters = engine.optimizer.single_partition_of_fp32_groups
    expect(all(m.dtype == torch.float32 for m in masters), "master weights stay fp32")
    reference, _, _ = T.train_ddp(T.TokenClassifier, batches, loss_fn=T.token_loss)
    expect(T.close(losses, reference, 5e-2, 1e-2), f"bf16 losses {losses} vs fp32 DDP {reference}")
    expect(losses[-1] < losses[0], "bf16 loss decreases")
    FIGURES["bf16_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
    expect(FIGURES["bf16_max_rel_diff"] > 0, "bf16 must not give exactly the fp32 trajectory")


def print_figures() -> None:
    """The figures the test module reads, printed once every check has run."""
    if dist.get_rank() == 0:
        print("FIGURES " + json.dumps(FIGURES), flush=True)


if __name__ == "__main__":
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    run_checks(teardown=print_figures)
