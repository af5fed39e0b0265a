"""Accelerate's examples/by_feature/cross_validation.py: k folds (scikit-learn's StratifiedKFold), one model per
fold prepared on the same Accelerator, `free_memory(model, optimizer)` between folds, and the folds' test
predictions averaged; same library calls, synthetic MRPC, tiny model.

Run: accel launch --cpu -n 2 cross_validation.py --cpu --num_folds 3
"""

import argparse
import os

import numpy as np
import torch
from sklearn.model_selection import StratifiedKFold
from synthetic import (
    GlueMrpcMetric,
    PairClassifier,
    final_metrics_line,
    get_dataloaders,
    get_linear_schedule_with_warmup,
    load_pair_datasets,
    pad_batch,
)
from torch.optim import AdamW
from torch.utils.data import DataLoader

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DistributedType
    from accelerate.utils import set_seed
else:
    from accel import Accelerator, DistributedType
    from accel.utils import set_seed

MAX_GPU_BATCH_SIZE = 16
EVAL_BATCH_SIZE = 32


def get_fold_dataloaders(accelerator, dataset, train_idxs, valid_idxs, batch_size=16):
    """Train and validation loaders from the fold's rows of the train split; the test loader is the validation split."""
    fold = {"train": dataset["train"].select(train_idxs), "validation": dataset["train"].select(valid_idxs)}
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size, datasets=fold)
    test_dataloader = DataLoader(dataset["validation"], shuffle=False, collate_fn=pad_batch, batch_size=EVAL_BATCH_SIZE)
    return train_dataloader, eval_dataloader, test_dataloader


def training_function(config, args):
    test_predictions = []
    datasets = load_pair_datasets()
    kfold = StratifiedKFold(n_splits=int(args.num_folds))
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

    folds = kfold.split(np.zeros(datasets["train"].num_rows), datasets["train"].column("labels"))
    test_references = []
    fold_accuracies = []
    for i, (train_idxs, valid_idxs) in enumerate(folds):
        train_dataloader, eval_dataloader, test_dataloader = get_fold_dataloaders(
            accelerator, datasets, train_idxs, valid_idxs
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
        fold_accuracies.append(eval_metric["accuracy"])

        # The test split is unprepared: each process predicts all of it, as the reference does.
        fold_predictions = []
        for step, batch in enumerate(test_dataloader):
            batch.to(accelerator.device)
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            fold_predictions.append(predictions.cpu())
            if i == 0:
                test_references.append(references.cpu())
        test_predictions.append(torch.cat(fold_predictions, dim=0))
        model, optimizer = accelerator.free_memory(model, optimizer)

    test_references = torch.cat(test_references, dim=0)
    preds = torch.stack(test_predictions, dim=0).sum(dim=0).div(int(args.num_folds)).argmax(dim=-1)
    test_metric = metric.compute(predictions=preds, references=test_references)
    accelerator.print("Average test metrics from all folds:", test_metric)
    accelerator.print(
        final_metrics_line(
            **test_metric,
            fold_accuracies=fold_accuracies,
            test_rows=len(test_references),
            mean_test_logit=float(torch.stack(test_predictions).mean()),
        )
    )


def main():
    parser = argparse.ArgumentParser(description="cross_validation, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--num_folds", type=int, default=3)
    args = parser.parse_args()
    config = {"lr": 3e-3, "num_epochs": 3, "seed": 42, "batch_size": 16, "warmup": 10}
    training_function(config, args)


if __name__ == "__main__":
    main()
