"""Accelerate's examples/complete_cv_example.py: cv_example plus trackers (log_with="all"), checkpoints every N
steps or each epoch, and resume with load_state + skip_first_batches; same library calls, on synthetic pet
images and a tiny CNN.

Run: accel launch --cpu -n 2 complete_cv_example.py --cpu --with_tracking --checkpointing_steps 4 --output_dir out
     then again with --resume_from_checkpoint out/step_8.
"""

import argparse
import os
import re

import numpy as np
import torch
from synthetic import (
    TinyConvNet,
    final_metrics_line,
    make_pet_images,
    random_resized_crop,
    resize,
    to_tensor,
    weight_norm,
)
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import DataLoader, Dataset

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import is_xpu_available
else:
    from accel import Accelerator, DataLoaderConfiguration
    from accel.utils import is_xpu_available


def extract_label(fname):
    return re.search(r"^(.*)_\d+\.jpg$", fname.split(os.path.sep)[-1]).groups()[0]


class PetsDataset(Dataset):
    def __init__(self, file_names, images, image_transform=None, label_to_id=None):
        self.file_names = file_names
        self.images = images
        self.image_transform = image_transform
        self.label_to_id = label_to_id

    def __len__(self):
        return len(self.file_names)

    def __getitem__(self, idx):
        image = to_tensor(self.images[idx])
        if self.image_transform is not None:
            image = self.image_transform(image)
        label = extract_label(self.file_names[idx])
        if self.label_to_id is not None:
            label = self.label_to_id[label]
        return {"image": image, "label": label}


def training_function(config, args):
    dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=args.use_stateful_dataloader)
    if args.with_tracking:
        accelerator = Accelerator(
            cpu=args.cpu,
            mixed_precision=args.mixed_precision,
            log_with="all",
            project_dir=args.project_dir,
            dataloader_config=dataloader_config,
        )
    else:
        accelerator = Accelerator(
            cpu=args.cpu, mixed_precision=args.mixed_precision, dataloader_config=dataloader_config
        )
    lr, num_epochs, seed, batch_size = (
        config["lr"],
        int(config["num_epochs"]),
        int(config["seed"]),
        int(config["batch_size"]),
    )
    image_size = config["image_size"]
    if not isinstance(image_size, (list, tuple)):
        image_size = (image_size, image_size)

    if hasattr(args.checkpointing_steps, "isdigit"):
        if args.checkpointing_steps == "epoch":
            checkpointing_steps = args.checkpointing_steps
        elif args.checkpointing_steps.isdigit():
            checkpointing_steps = int(args.checkpointing_steps)
        else:
            raise ValueError(f"`checkpointing_steps` must be a number or `epoch`, got `{args.checkpointing_steps}`.")
    else:
        checkpointing_steps = None
    if args.with_tracking:
        run = os.path.split(__file__)[-1].split(".")[0]
        accelerator.init_trackers(run, config)

    file_names, images = make_pet_images()
    id_to_label = sorted(set(extract_label(fname) for fname in file_names))
    label_to_id = {lbl: i for i, lbl in enumerate(id_to_label)}

    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    elif is_xpu_available():
        torch.xpu.manual_seed_all(seed)
    random_perm = np.random.permutation(len(file_names))
    cut = int(0.8 * len(file_names))
    train_split, eval_split = random_perm[:cut], random_perm[cut:]
    train_dataset = PetsDataset(
        [file_names[i] for i in train_split],
        images[train_split],
        image_transform=lambda image: random_resized_crop(image, image_size, scale=(0.5, 1.0)),
        label_to_id=label_to_id,
    )
    eval_dataset = PetsDataset(
        [file_names[i] for i in eval_split],
        images[eval_split],
        image_transform=lambda image: resize(image, image_size),
        label_to_id=label_to_id,
    )

    # The reference uses 4 workers; 2 fit this 2-core machine and still draw the augmentation in workers.
    train_dataloader = DataLoader(train_dataset, shuffle=True, batch_size=batch_size, num_workers=2)
    eval_dataloader = DataLoader(eval_dataset, shuffle=False, batch_size=batch_size, num_workers=2)

    model = TinyConvNet(num_classes=len(label_to_id))
    model = model.to(accelerator.device)
    for param in model.parameters():
        param.requires_grad = False
    for param in model.get_classifier().parameters():
        param.requires_grad = True
    mean = torch.tensor(model.default_cfg["mean"])[None, :, None, None].to(accelerator.device)
    std = torch.tensor(model.default_cfg["std"])[None, :, None, None].to(accelerator.device)

    optimizer = torch.optim.Adam(params=model.parameters(), lr=lr / 25)
    lr_scheduler = OneCycleLR(optimizer=optimizer, max_lr=lr, epochs=num_epochs, steps_per_epoch=len(train_dataloader))
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )

    overall_step = 0
    starting_epoch = 0
    if args.resume_from_checkpoint:
        accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
        accelerator.load_state(args.resume_from_checkpoint)
        training_difference = os.path.splitext(os.path.basename(args.resume_from_checkpoint))[0]
        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
            resume_step = None
        else:
            resume_step = int(training_difference.replace("step_", ""))
            starting_epoch = resume_step // len(train_dataloader)
            resume_step -= starting_epoch * len(train_dataloader)

    for epoch in range(starting_epoch, num_epochs):
        model.train()
        if args.with_tracking:
            total_loss = 0
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
            overall_step += resume_step
        else:
            active_dataloader = train_dataloader
        for batch in active_dataloader:
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            inputs = (batch["image"] - mean) / std
            outputs = model(inputs)
            loss = torch.nn.functional.cross_entropy(outputs, batch["label"])
            if args.with_tracking:
                total_loss += loss.detach().float()
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            overall_step += 1
            if isinstance(checkpointing_steps, int):
                output_dir = f"step_{overall_step}"
                if overall_step % checkpointing_steps == 0:
                    if args.output_dir is not None:
                        output_dir = os.path.join(args.output_dir, output_dir)
                    accelerator.save_state(output_dir)

        model.eval()
        accurate = 0
        num_elems = 0
        for step, batch in enumerate(eval_dataloader):
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            inputs = (batch["image"] - mean) / std
            with torch.no_grad():
                outputs = model(inputs)
            predictions = outputs.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["label"]))
            accurate_preds = predictions == references
            num_elems += accurate_preds.shape[0]
            accurate += accurate_preds.long().sum()
        eval_metric = accurate.item() / num_elems
        accelerator.print(f"epoch {epoch}: {100 * eval_metric:.2f}")
        if args.with_tracking:
            accelerator.log(
                {
                    "accuracy": 100 * eval_metric,
                    "train_loss": total_loss.item() / len(train_dataloader),
                    "epoch": epoch,
                },
                step=overall_step,
            )
        if checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)
    accelerator.print(
        final_metrics_line(
            accuracy=eval_metric,
            eval_samples=num_elems,
            last_loss=loss.item(),
            lr=lr_scheduler.get_last_lr()[0],
            weight_norm=weight_norm(model),
            overall_step=overall_step,
        )
    )
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="complete_cv_example, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    parser.add_argument("--checkpointing_steps", type=str, default=None, help="a number of steps, or 'epoch'")
    parser.add_argument("--output_dir", type=str, default=".")
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--use_stateful_dataloader", action="store_true")
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--project_dir", type=str, default="logs")
    args = parser.parse_args()
    config = {"lr": 3e-2, "num_epochs": 3, "seed": 42, "batch_size": 16, "image_size": 16}
    training_function(config, args)


if __name__ == "__main__":
    main()
