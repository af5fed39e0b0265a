"""Accelerate's examples/cv_example.py: images with a random augmentation drawn in DataLoader workers, a frozen
backbone with a trained classifier, OneCycleLR sized from the loader before `prepare`, accuracy from
`gather_for_metrics`; same library calls, on synthetic pet images and a tiny CNN.

Run: accel launch --cpu -n 2 cv_example.py --cpu
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
    from accelerate import Accelerator
    from accelerate.utils import set_seed
else:
    from accel import Accelerator
    from accel.utils import set_seed


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
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    lr, num_epochs, seed, batch_size = (
        config["lr"],
        int(config["num_epochs"]),
        int(config["seed"]),
        int(config["batch_size"]),
    )
    image_size = config["image_size"]
    if not isinstance(image_size, (list, tuple)):
        image_size = (image_size, image_size)

    file_names, images = make_pet_images()
    id_to_label = sorted(set(extract_label(fname) for fname in file_names))
    label_to_id = {lbl: i for i, lbl in enumerate(id_to_label)}

    set_seed(seed)
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

    for epoch in range(num_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            inputs = (batch["image"] - mean) / std
            outputs = model(inputs)
            loss = torch.nn.functional.cross_entropy(outputs, batch["label"])
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

        model.eval()
        accurate = 0
        num_elems = 0
        for _, batch in enumerate(eval_dataloader):
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
    accelerator.print(
        final_metrics_line(
            accuracy=eval_metric,
            eval_samples=num_elems,
            last_loss=loss.item(),
            lr=lr_scheduler.get_last_lr()[0],
            weight_norm=weight_norm(model),
        )
    )
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="cv_example, synthetic")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="If passed, will train on the CPU.")
    args = parser.parse_args()
    config = {"lr": 3e-2, "num_epochs": 3, "seed": 42, "batch_size": 16, "image_size": 16}
    training_function(config, args)


if __name__ == "__main__":
    main()
