"""Accelerate's examples/by_feature/fsdp_with_peak_mem_tracking.py: an FSDP plugin made in the script with full
state dict configs and no state_dict_type, the process's peak memory tracked around training and evaluation;
same library calls, synthetic MRPC, tiny model. The memory figures are printed, not compared (they are the
machine's); the final metrics are.

On 2 CPU processes Accelerate runs the script as MULTI_CPU data parallelism (its FSDP needs accelerator devices),
accel under real FSDP2 over gloo: the numbers agree since both average the same gradients.

Run: accel launch --cpu -n 2 fsdp_with_peak_mem_tracking.py --cpu
"""

import argparse
import gc
import math
import os
import threading

import psutil
import torch
from synthetic import (
    GlueMrpcMetric,
    PairClassifier,
    final_metrics_line,
    get_dataloaders,
    get_linear_schedule_with_warmup,
)
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils import set_seed
else:
    from accel import Accelerator, DistributedType, FullyShardedDataParallelPlugin
    from accel.utils import set_seed

MAX_GPU_BATCH_SIZE = 16


def b2mb(x):
    return int(x / 2**20)


class TorchTracemalloc:
    """The reference's peak-memory tracker, on the CPU branch (resident set size, sampled by a thread)."""

    def __enter__(self):
        gc.collect()
        self.begin = 0
        self.process = psutil.Process()
        self.cpu_begin = self.cpu_mem_used()
        self.peak_monitoring = True
        self.cpu_peak = -1
        peak_monitor_thread = threading.Thread(target=self.peak_monitor_func)
        peak_monitor_thread.daemon = True
        peak_monitor_thread.start()
        return self

    def cpu_mem_used(self):
        return self.process.memory_info().rss

    def peak_monitor_func(self):
        while self.peak_monitoring:
            self.cpu_peak = max(self.cpu_mem_used(), self.cpu_peak)

    def __exit__(self, *exc):
        self.peak_monitoring = False
        gc.collect()
        self.cpu_end = self.cpu_mem_used()
        self.cpu_used = b2mb(self.cpu_end - self.cpu_begin)
        self.cpu_peaked = b2mb(self.cpu_peak - self.cpu_begin)


def full_weight_norm(accelerator, model):
    """The L2 norm of the full parameters (gathered by get_state_dict under FSDP), in float64."""
    state = accelerator.get_state_dict(model)
    return math.sqrt(sum(float(v.detach().double().pow(2).sum()) for v in state.values() if v.is_floating_point()))


def training_function(config, args):
    fsdp_plugin = FullyShardedDataParallelPlugin(
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False),
    )
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision, fsdp_plugin=fsdp_plugin)
    accelerator.print(accelerator.distributed_type)
    lr, num_epochs, seed, batch_size = (
        config["lr"],
        int(config["num_epochs"]),
        int(config["seed"]),
        int(config["batch_size"]),
    )
    metric = GlueMrpcMetric()

    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    set_seed(seed)
    model = PairClassifier()
    no_decay = ["bias", "norm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": 0.003,
        },
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(params=optimizer_grouped_parameters, lr=lr, weight_decay=2e-4)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=config["warmup"],
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    for epoch in range(num_epochs):
        with TorchTracemalloc() as tracemalloc:
            model.train()
            for step, batch in enumerate(train_dataloader):
                batch.to(accelerator.device)
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                if step % gradient_accumulation_steps == 0:
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
        accelerator.print(f"Peak CPU memory consumed during the train (max-begin): {tracemalloc.cpu_peaked}")

        with TorchTracemalloc() as tracemalloc:
            model.eval()
            for step, batch in enumerate(eval_dataloader):
                batch.to(accelerator.device)
                with torch.no_grad():
                    outputs = model(**batch)
                predictions = outputs.logits.argmax(dim=-1)
                predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
                metric.add_batch(predictions=predictions, references=references)
            eval_metric = metric.compute()
            accelerator.print(f"epoch {epoch}:", eval_metric)
        accelerator.print(f"Peak CPU memory consumed during the eval (max-begin): {tracemalloc.cpu_peaked}")

    accelerator.print(
        final_metrics_line(
            **eval_metric,
            last_loss=loss.item(),
            lr=lr_scheduler.get_last_lr()[0],
            weight_norm=full_weight_norm(accelerator, model),
        )
    )
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="fsdp_with_peak_mem_tracking, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup": 10}
    training_function(config, args)


if __name__ == "__main__":
    main()
