"""Accelerate's examples/nlp_example.py, made of the same library calls, on a synthetic MRPC and a tiny model.

Run: ACCEL_COMPAT_LIB=accel accel launch --cpu -n 2 nlp_example.py --cpu
 or: ACCEL_COMPAT_LIB=accelerate torchrun --nproc_per_node 2 nlp_example.py --cpu
"""

import argparse
import os

import torch
from synthetic import (
    GlueMrpcMetric,
    PairClassifier,
    final_metrics_line,
    get_dataloaders,
    get_linear_schedule_with_warmup,
    weight_norm,
)
from torch.optim import AdamW

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DistributedType
    from accelerate.utils import set_seed
else:
    from accel import Accelerator, DistributedType
    from accel.utils import set_seed

MAX_GPU_BATCH_SIZE = 16


def training_function(config, args):
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr, num_epochs, seed, batch_size = (
        config["lr"],
        int(config["num_epochs"]),
        int(config["seed"]),
        int(config["batch_size"]),
    )
    metric = GlueMrpcMetric()

    # Too large a batch becomes gradient accumulation done by hand, as in the reference.
    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(
        accelerator, batch_size, train_drop_last=True, eval_drop_last=(accelerator.mixed_precision == "fp8")
    )
    model = PairClassifier()
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=config["warmup"],
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch.to(accelerator.device)
            outputs = model(**batch)
            loss = outputs.loss
            loss = loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
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
            **eval_metric, last_loss=loss.item(), lr=lr_scheduler.get_last_lr()[0], weight_norm=weight_norm(model)
        )
    )
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="nlp_example, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup": 10}
    training_function(config, args)


if __name__ == "__main__":
    main()
