"""Accelerate's examples/by_feature/automatic_gradient_accumulation.py: `find_executable_batch_size` finds the
batch that fits, and `accelerator.gradient_accumulation_steps` is set so that the observed batch stays
the same; same library calls, synthetic MRPC, tiny model.

The model fails like an out-of-memory device when training on batches above 16 (synthetic.MemoryBudget):
the observed batch of 64 shrinks (x0.9 a try in Accelerate 1.15) to 15, trained with 64 // 15 = 4
accumulation steps.
Run: accel launch --cpu -n 2 automatic_gradient_accumulation.py --cpu
"""

import argparse
import os

import torch
from synthetic import (
    GlueMrpcMetric,
    MemoryBudget,
    PairClassifier,
    final_metrics_line,
    get_dataloaders,
    get_linear_schedule_with_warmup,
    weight_norm,
)
from torch.optim import AdamW

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import find_executable_batch_size, set_seed
else:
    from accel import Accelerator
    from accel.utils import find_executable_batch_size, set_seed


def training_function(config, args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr, num_epochs, seed = config["lr"], int(config["num_epochs"]), int(config["seed"])
    observed_batch_size = int(config["batch_size"])
    metric = GlueMrpcMetric()
    tried = []

    @find_executable_batch_size(starting_batch_size=int(observed_batch_size))
    def inner_training_loop(batch_size):
        nonlocal accelerator
        num_gradient_accumulation_steps = observed_batch_size // batch_size
        accelerator.gradient_accumulation_steps = num_gradient_accumulation_steps
        accelerator.free_memory()
        tried.append(batch_size)
        set_seed(seed)
        model = MemoryBudget(PairClassifier(), max_batch=16)
        model = model.to(accelerator.device)
        optimizer = AdamW(params=model.parameters(), lr=lr)
        train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
        lr_scheduler = get_linear_schedule_with_warmup(
            optimizer=optimizer,
            num_warmup_steps=config["warmup"],
            num_training_steps=(len(train_dataloader) * num_epochs),
        )
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
            model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
        )

        for epoch in range(num_epochs):
            model.train()
            for step, batch in enumerate(train_dataloader):
                with accelerator.accumulate(model):
                    batch.to(accelerator.device)
                    outputs = model(**batch)
                    loss = outputs.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()

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
        accelerator.print(
            final_metrics_line(
                **eval_metric,
                last_loss=loss.item(),
                lr=lr_scheduler.get_last_lr()[0],
                weight_norm=weight_norm(model),
                batch_sizes_tried=tried,
                gradient_accumulation_steps=accelerator.gradient_accumulation_steps,
            )
        )

    inner_training_loop()
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="automatic_gradient_accumulation, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 64, "warmup": 10}
    training_function(config, args)


if __name__ == "__main__":
    main()
