"""Accelerate's examples/by_feature/local_sgd.py: `LocalSGD` averages the parameters every K steps instead of
the gradients at each; same library calls, synthetic MRPC, tiny model.

Run: accel launch --cpu -n 2 local_sgd.py --cpu --local_sgd_steps 4
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
    from accelerate import Accelerator
    from accelerate.local_sgd import LocalSGD
    from accelerate.utils import set_seed
else:
    from accel import Accelerator
    from accel.local_sgd import LocalSGD
    from accel.utils import set_seed


def training_function(config, args):
    gradient_accumulation_steps = int(args.gradient_accumulation_steps)
    local_sgd_steps = int(args.local_sgd_steps)
    accelerator = Accelerator(
        cpu=args.cpu, mixed_precision=args.mixed_precision, gradient_accumulation_steps=gradient_accumulation_steps
    )
    lr, num_epochs, seed, batch_size = (
        config["lr"],
        int(config["num_epochs"]),
        int(config["seed"]),
        int(config["batch_size"]),
    )
    metric = GlueMrpcMetric()
    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = PairClassifier()
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=config["warmup"], num_training_steps=(len(train_dataloader) * num_epochs)
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    for epoch in range(num_epochs):
        model.train()
        with LocalSGD(
            accelerator=accelerator, model=model, local_sgd_steps=local_sgd_steps, enabled=local_sgd_steps is not None
        ) as local_sgd:
            for step, batch in enumerate(train_dataloader):
                batch.to(accelerator.device)
                with accelerator.accumulate(model):
                    output = model(**batch)
                    loss = output.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
                    local_sgd.step()

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
    parser = argparse.ArgumentParser(description="local_sgd, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--local_sgd_steps", type=int, default=8)
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup": 10}
    training_function(config, args)


if __name__ == "__main__":
    main()
