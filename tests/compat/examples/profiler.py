"""Accelerate's examples/by_feature/profiler.py: `ProfileKwargs` in `kwargs_handlers` and `with
accelerator.profile() as prof` around the training loop, a trace per rank; same library calls,
synthetic MRPC, tiny model.

Run: accel launch --cpu -n 2 profiler.py --cpu --record_shapes --output_trace_dir traces
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
    from accelerate.utils import ProfileKwargs, set_seed
else:
    from accel import Accelerator
    from accel.utils import ProfileKwargs, set_seed


def training_function(config, args):
    profile_kwargs = ProfileKwargs(
        record_shapes=args.record_shapes,
        profile_memory=args.profile_memory,
        with_flops=args.with_flops,
        output_trace_dir=args.output_trace_dir,
    )
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision, kwargs_handlers=[profile_kwargs])
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
        with accelerator.profile() as prof:
            for step, batch in enumerate(train_dataloader):
                batch.to(accelerator.device)
                with accelerator.accumulate(model):
                    output = model(**batch)
                    loss = output.loss
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
        table = prof.key_averages().table(
            sort_by="self_cpu_time_total" if args.cpu else f"self_{accelerator.device.type}_time_total", row_limit=-1
        )
        accelerator.print(table)

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
    traces = sorted(os.listdir(args.output_trace_dir)) if args.output_trace_dir else []
    accelerator.print(
        final_metrics_line(
            **eval_metric,
            last_loss=loss.item(),
            lr=lr_scheduler.get_last_lr()[0],
            weight_norm=weight_norm(model),
            trace_files=traces,
            profiled_addmm="aten::addmm" in table,
        )
    )
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="profiler, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--record_shapes", action="store_true", default=False)
    parser.add_argument("--profile_memory", action="store_true", default=False)
    parser.add_argument("--with_flops", action="store_true", default=False)
    parser.add_argument("--output_trace_dir", type=str, default=None)
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup": 10}
    training_function(config, args)


if __name__ == "__main__":
    main()
