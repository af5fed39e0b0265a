"""Accelerate's examples/by_feature/schedule_free.py: `schedulefree.AdamWScheduleFree` prepared without a
scheduler, `optimizer.train()` / `optimizer.eval()` through the prepared optimizer, `is_schedulefree_available`;
same library calls, synthetic MRPC, tiny model. Needs the `schedulefree` package.

Run: accel launch --cpu -n 2 schedule_free.py --cpu
"""

import argparse
import os

import torch
from synthetic import GlueMrpcMetric, PairClassifier, final_metrics_line, get_dataloaders, weight_norm

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DistributedType
    from accelerate.utils import is_schedulefree_available, set_seed
else:
    from accel import Accelerator, DistributedType
    from accel.utils import is_schedulefree_available, set_seed

if is_schedulefree_available():
    import schedulefree
else:
    raise ImportError("This example requires the `schedulefree` library: pip install schedulefree")

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
    gradient_accumulation_steps = 1
    if batch_size > MAX_GPU_BATCH_SIZE and accelerator.distributed_type != DistributedType.XLA:
        gradient_accumulation_steps = batch_size // MAX_GPU_BATCH_SIZE
        batch_size = MAX_GPU_BATCH_SIZE
    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = PairClassifier()
    model = model.to(accelerator.device)
    optimizer = schedulefree.AdamWScheduleFree(model.parameters(), lr=lr, warmup_steps=config["warmup"])
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader
    )

    for epoch in range(num_epochs):
        model.train()
        optimizer.train()
        for step, batch in enumerate(train_dataloader):
            batch.to(accelerator.device)
            outputs = model(**batch)
            loss = outputs.loss
            loss = loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()

        model.eval()
        optimizer.eval()
        for step, batch in enumerate(eval_dataloader):
            batch.to(accelerator.device)
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            metric.add_batch(predictions=predictions, references=references)
        eval_metric = metric.compute()
        accelerator.print(f"epoch {epoch}:", eval_metric)
    accelerator.print(final_metrics_line(**eval_metric, last_loss=loss.item(), weight_norm=weight_norm(model)))
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="schedule_free, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup": 10}
    training_function(config, args)


if __name__ == "__main__":
    main()
