"""Accelerate's examples/by_feature/gradient_accumulation_for_autoregressive_models.py: the tokens of a whole
accumulated step counted across ranks with `gather`, `model.no_sync` on the micro-steps but the last,
`clip_grad_norm_`, and a perplexity from `gather_for_metrics`; same library calls, on synthetic token
sequences and a tiny causal LM (its loss divides by `num_items_in_batch` as `transformers` does).

Run: accel launch --cpu -n 2 gradient_accumulation_for_autoregressive_models.py --cpu --gradient_accumulation_steps 2
"""

import argparse
import contextlib
import math
import os

import torch
from synthetic import (
    IGNORE_INDEX,
    PAD,
    TinyCausalLM,
    final_metrics_line,
    get_constant_schedule,
    load_text_datasets,
    pad_for_causal_lm,
    weight_norm,
)
from torch.optim import AdamW
from torch.utils.data import DataLoader

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DistributedType
    from accelerate.utils import set_seed
else:
    from accel import Accelerator, DistributedType
    from accel.utils import set_seed

EVAL_BATCH_SIZE = 32


def get_dataloaders(accelerator, batch_size=16):
    with accelerator.local_main_process_first():
        datasets = load_text_datasets()
    with accelerator.main_process_first():
        datasets = {
            name: split.select([i for i, row in enumerate(split) if len(row["input_ids"]) > 0])
            for name, split in datasets.items()
        }

    def collate_fn(examples):
        max_length = (
            128 if accelerator.distributed_type == DistributedType.XLA else max(len(e["input_ids"]) for e in examples)
        )
        if accelerator.mixed_precision == "fp8":
            pad_to_multiple_of = 16
        elif accelerator.mixed_precision != "no":
            pad_to_multiple_of = 8
        else:
            pad_to_multiple_of = None
        batch = pad_for_causal_lm(examples, max_length=max_length + 1, pad_to_multiple_of=pad_to_multiple_of)
        batch["labels"] = batch["input_ids"][:, 1:]
        batch["input_ids"] = batch["input_ids"][:, :-1]
        batch["labels"] = torch.where(batch["labels"] == PAD, IGNORE_INDEX, batch["labels"])
        return batch

    train_dataloader = DataLoader(datasets["train"], shuffle=False, collate_fn=collate_fn, batch_size=batch_size)
    eval_dataloader = DataLoader(
        datasets["validation"], shuffle=False, collate_fn=collate_fn, batch_size=EVAL_BATCH_SIZE
    )
    return train_dataloader, eval_dataloader


def training_function(config, args):
    gradient_accumulation_steps = int(args.gradient_accumulation_steps)
    accelerator = Accelerator(
        cpu=args.cpu, mixed_precision=args.mixed_precision, gradient_accumulation_steps=gradient_accumulation_steps
    )
    if accelerator.distributed_type == DistributedType.XLA and gradient_accumulation_steps > 1:
        raise NotImplementedError(
            "Gradient accumulation on TPUs is not supported; pass `gradient_accumulation_steps=1`."
        )
    lr, num_epochs, seed, batch_size = (
        config["lr"],
        int(config["num_epochs"]),
        int(config["seed"]),
        int(config["batch_size"]),
    )
    max_grad_norm = config["max_grad_norm"]

    set_seed(seed)
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = TinyCausalLM()
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_constant_schedule(optimizer=optimizer)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    num_samples_in_epoch = len(train_dataloader)
    remainder = num_samples_in_epoch % gradient_accumulation_steps
    remainder = remainder if remainder != 0 else gradient_accumulation_steps
    total_gradient_updates = math.ceil(num_samples_in_epoch / gradient_accumulation_steps)

    total_batched_samples = 0
    for epoch in range(num_epochs):
        model.train()
        training_iterator = iter(train_dataloader)
        for update_step in range(total_gradient_updates):
            # Load the whole accumulated step first, to count the tokens the loss is averaged over.
            batch_samples = []
            num_batches_in_step = (
                gradient_accumulation_steps if update_step != (total_gradient_updates - 1) else remainder
            )
            for _ in range(num_batches_in_step):
                batch_samples += [next(training_iterator)]
            local_num_items_in_batch = sum([(batch["labels"].ne(IGNORE_INDEX)).sum() for batch in batch_samples])
            num_items_in_batch = accelerator.gather(local_num_items_in_batch).sum().item()
            losses = []
            for i, batch in enumerate(batch_samples):
                ctx = (
                    model.no_sync
                    if (i < len(batch_samples) - 1 and accelerator.num_processes > 1)
                    else contextlib.nullcontext
                )
                with ctx():
                    total_batched_samples += 1
                    outputs = model(**batch, use_cache=False, num_items_in_batch=num_items_in_batch)
                    loss = outputs.loss
                    # DDP averages over ranks and accelerate over micro-steps; the loss is already a mean over all of
                    # them.
                    loss = loss * gradient_accumulation_steps * accelerator.num_processes
                    accelerator.backward(loss)
                    losses.append(loss.detach())

            grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses = accelerator.gather(sum(losses)).sum().item() / (
                accelerator.num_processes * gradient_accumulation_steps
            )
            grad_norm = grad_norm.detach().item() if isinstance(grad_norm, torch.Tensor) else grad_norm
            accelerator.print(
                f"epoch {epoch} - update step {update_step}:: grad norm: {grad_norm} ::train loss: {losses}"
            )

        model.eval()
        eval_losses = []
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch, use_cache=False)
            eval_loss = outputs.loss
            eval_losses.append(accelerator.gather_for_metrics(eval_loss.repeat(EVAL_BATCH_SIZE)))
        eval_losses = torch.cat(eval_losses)
        try:
            eval_loss = torch.mean(eval_losses)
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        accelerator.print(f"epoch {epoch}:: eval perplexity: {perplexity} eval_loss: {eval_loss}")
    accelerator.print(
        final_metrics_line(
            perplexity=perplexity,
            eval_loss=eval_loss,
            train_loss=losses,
            grad_norm=grad_norm,
            weight_norm=weight_norm(model),
            micro_batches=total_batched_samples,
            gathered_eval_values=len(eval_losses),
        )
    )
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="gradient_accumulation_for_autoregressive_models, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--per_device_batch_size", type=int, default=4)
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": args.per_device_batch_size, "max_grad_norm": 1.0}
    training_function(config, args)


if __name__ == "__main__":
    main()
