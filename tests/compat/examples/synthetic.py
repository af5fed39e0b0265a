"""Offline stand-ins for what Accelerate's example scripts download, shared by the scripts beside this file.

The reference examples fine-tune `bert-base-cased` on GLUE MRPC (scored with `evaluate`), a timm
ResNet on the Oxford pets images, and SmolLM on WikiText. This machine has no downloads, so each
script here takes the same calls of the training library but uses these instead: a sentence-pair
dataset of token ids with a paraphrase-like label, a tiny randomly initialised classifier that is
called like a `transformers` model (`model(**batch).loss / .logits`), small synthetic images, a tiny
causal language model, the MRPC metric (accuracy, F1) and the two `transformers` schedules used.

Nothing here imports the library under test: each example script does that itself, through the
`ACCEL_COMPAT_LIB` switch at its top, so the same file runs on Accelerate and on accel.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader

PAD, CLS, SEP = 0, 1, 2
VOCAB = 40
IGNORE_INDEX = -100


class Table:
    """Rows of a dataset split, with the two `datasets.Dataset` methods the examples use (`select`, a column)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def select(self, indices: Sequence[int]) -> Table:
        return Table([self.rows[int(i)] for i in indices])

    def column(self, name: str) -> list[Any]:
        return [row[name] for row in self.rows]


def _pair(rng: np.random.RandomState) -> tuple[list[int], list[int], int]:
    first = rng.randint(3, VOCAB, size=rng.randint(4, 12))
    label = int(rng.rand() < 0.5)
    if label:  # a paraphrase: the same words, reordered, one of them replaced
        second = rng.permutation(first)
        second[rng.randint(len(second))] = rng.randint(3, VOCAB)
    else:
        second = rng.randint(3, VOCAB, size=rng.randint(4, 12))
    if rng.rand() < 0.1:  # label noise, so that accuracy stays informative
        label = 1 - label
    return first.tolist(), second.tolist(), label


def load_pair_datasets(train_rows: int = 320, validation_rows: int = 75, seed: int = 1234) -> dict[str, Table]:
    """An MRPC-shaped dataset, already tokenized: `input_ids`, `token_type_ids`, `attention_mask`, `labels`.

    75 validation rows do not split evenly over 2 processes x 32, so `gather_for_metrics` has a
    duplicated sample to drop.
    """
    rng = np.random.RandomState(seed)
    splits = {}
    for name, count in (("train", train_rows), ("validation", validation_rows)):
        rows = []
        for _ in range(count):
            first, second, label = _pair(rng)
            ids = [CLS, *first, SEP, *second, SEP]
            types = [0] * (len(first) + 2) + [1] * (len(second) + 1)
            rows.append({"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids), "labels": label})
        splits[name] = Table(rows)
    return splits


class Batch(dict):
    """A dict of tensors with `.to(device)`, as `transformers`' BatchEncoding: the examples call `batch.to(device)`."""

    def to(self, device: Any, non_blocking: bool = False) -> Batch:
        for key, value in self.items():
            self[key] = value.to(device, non_blocking=non_blocking)
        return self


def pad_batch(
    examples: list[dict[str, Any]], pad_to_multiple_of: int | None = None, max_length: int | None = None
) -> Batch:
    """Pads token lists to the longest (or `max_length`), as a tokenizer's `pad(padding="longest")` does."""
    longest = max_length or max(len(e["input_ids"]) for e in examples)
    if pad_to_multiple_of:
        longest = math.ceil(longest / pad_to_multiple_of) * pad_to_multiple_of
    batch = Batch()
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        batch[key] = torch.tensor([e[key] + [PAD] * (longest - len(e[key])) for e in examples], dtype=torch.long)
    batch["labels"] = torch.tensor([e["labels"] for e in examples], dtype=torch.long)
    return batch


@dataclass
class ModelOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


class PairClassifier(nn.Module):
    """A tiny sentence-pair classifier called like `AutoModelForSequenceClassification`."""

    def __init__(self, dim: int = 16, num_labels: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.hidden = nn.Linear(3 * dim, dim)
        self.classifier = nn.Linear(dim, num_labels)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> ModelOutput:
        tokens = self.embed(input_ids)
        mask = attention_mask.unsqueeze(-1).float()
        second = token_type_ids.unsqueeze(-1).float() * mask
        first = mask - second
        a = (tokens * first).sum(1) / first.sum(1).clamp(min=1)
        b = (tokens * second).sum(1) / second.sum(1).clamp(min=1)
        logits = self.classifier(torch.tanh(self.hidden(torch.cat([a, b, a * b], dim=-1))))
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return ModelOutput(loss=loss, logits=logits)


class MemoryBudget(nn.Module):
    """Wraps a model and fails like a device out of memory when it trains on a batch larger than `max_batch`
    (evaluation, without gradients, fits).

    CPUs here have memory to spare, so `find_executable_batch_size` would never see the error it
    exists for; this raises the allocator's own message, which both libraries recognise.
    """

    def __init__(self, model: nn.Module, max_batch: int) -> None:
        super().__init__()
        self.model = model
        self.max_batch = max_batch

    def forward(self, **batch: torch.Tensor) -> Any:
        if self.training and batch["input_ids"].shape[0] > self.max_batch:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes.")
        return self.model(**batch)


class GlueMrpcMetric:
    """Accuracy and F1 of the positive class, as `evaluate.load("glue", "mrpc")` computes them."""

    def __init__(self) -> None:
        self._predictions: list[torch.Tensor] = []
        self._references: list[torch.Tensor] = []

    def add_batch(self, predictions: torch.Tensor, references: torch.Tensor) -> None:
        self._predictions.append(predictions.detach().cpu().reshape(-1))
        self._references.append(references.detach().cpu().reshape(-1))

    def compute(
        self, predictions: torch.Tensor | None = None, references: torch.Tensor | None = None
    ) -> dict[str, float]:
        if predictions is None:
            predictions, references = torch.cat(self._predictions), torch.cat(self._references)
            self._predictions, self._references = [], []
        true_pos = int(((predictions == 1) & (references == 1)).sum())
        predicted, actual = int((predictions == 1).sum()), int((references == 1).sum())
        f1 = 2 * true_pos / (predicted + actual) if predicted + actual else 0.0
        return {"accuracy": float((predictions == references).float().mean()), "f1": f1}


def get_linear_schedule_with_warmup(
    optimizer: torch.optim.Optimizer, num_warmup_steps: int, num_training_steps: int
) -> LambdaLR:
    """`transformers`' linear warmup then linear decay to 0."""

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return step / max(1, num_warmup_steps)
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return LambdaLR(optimizer, factor)


def get_constant_schedule(optimizer: torch.optim.Optimizer) -> LambdaLR:
    return LambdaLR(optimizer, lambda _: 1.0)


def get_dataloaders(
    accelerator: Any,
    batch_size: int = 16,
    eval_batch_size: int = 32,
    datasets: dict[str, Table] | None = None,
    train_drop_last: bool = False,
    eval_drop_last: bool = False,
) -> tuple[DataLoader, DataLoader]:
    """The reference examples' `get_dataloaders`, with the same library calls: the data is made under
    `accelerator.main_process_first()`, and the collate function pads by `distributed_type` (XLA) and
    `mixed_precision`. `datasets` replaces the made data (cross-validation passes its folds)."""
    if datasets is None:
        with accelerator.main_process_first():
            datasets = load_pair_datasets()

    def collate_fn(examples: list[dict[str, Any]]) -> Batch:
        max_length = 128 if accelerator.distributed_type == "XLA" else None
        if accelerator.mixed_precision == "fp8":
            pad_to_multiple_of = 16
        elif accelerator.mixed_precision != "no":
            pad_to_multiple_of = 8
        else:
            pad_to_multiple_of = None
        return pad_batch(examples, pad_to_multiple_of=pad_to_multiple_of, max_length=max_length)

    train_dataloader = DataLoader(
        datasets["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size, drop_last=train_drop_last
    )
    eval_dataloader = DataLoader(
        datasets["validation"],
        shuffle=False,
        collate_fn=collate_fn,
        batch_size=eval_batch_size,
        drop_last=eval_drop_last,
    )
    return train_dataloader, eval_dataloader


# --- images (cv_example, complete_cv_example) ---

PET_BREEDS = ("abyssinian", "beagle", "persian", "pug")


def make_pet_images(count: int = 203, size: int = 20, seed: int = 4321) -> tuple[list[str], np.ndarray]:
    """Names like the pets files (`<breed>_<n>.jpg`) and uint8 HxWx3 images: a breed's pattern plus noise."""
    rng = np.random.RandomState(seed)
    patterns = rng.rand(len(PET_BREEDS), size, size, 3)
    names, images = [], []
    for n in range(count):
        breed = rng.randint(len(PET_BREEDS))
        names.append(f"{PET_BREEDS[breed]}_{n}.jpg")
        images.append(np.clip(0.6 * patterns[breed] + 0.4 * rng.rand(size, size, 3), 0, 1))
    return names, (np.stack(images) * 255).astype(np.uint8)


def to_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image).permute(2, 0, 1).float() / 255


def resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return F.interpolate(image[None], size=size, mode="bilinear", align_corners=False)[0]


def random_resized_crop(
    image: torch.Tensor, size: tuple[int, int], scale: tuple[float, float] = (0.5, 1.0)
) -> torch.Tensor:
    """A square crop of a random share of the area, resized; draws from torch's global RNG as torchvision does."""
    height, width = image.shape[-2:]
    area = scale[0] + (scale[1] - scale[0]) * float(torch.rand(()))
    side = max(1, round(math.sqrt(area * height * width)))
    top = int(torch.randint(0, height - side + 1, ()))
    left = int(torch.randint(0, width - side + 1, ()))
    return resize(image[:, top : top + side, left : left + side], size)


class TinyConvNet(nn.Module):
    """A small CNN with the timm model surface the CV examples use: `get_classifier()` and `default_cfg`."""

    default_cfg: ClassVar[dict[str, Any]] = {"mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.classifier = nn.Linear(8 * 16, num_classes)

    def get_classifier(self) -> nn.Module:
        return self.classifier

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


# --- causal language model (gradient_accumulation_for_autoregressive_models) ---


def load_text_datasets(train_rows: int = 120, validation_rows: int = 40, seed: int = 99) -> dict[str, Table]:
    """Token sequences of varying length (some empty, to be filtered out) from a small Markov chain."""
    rng = np.random.RandomState(seed)
    step = rng.randint(1, 5, size=VOCAB)
    splits = {}
    for name, count in (("train", train_rows), ("validation", validation_rows)):
        rows = []
        for _ in range(count):
            length = 0 if rng.rand() < 0.1 else rng.randint(3, 24)
            ids = [int(rng.randint(3, VOCAB))]
            while len(ids) < length:
                ids.append(3 + (ids[-1] + int(step[ids[-1]]) + int(rng.rand() < 0.2)) % (VOCAB - 3))
            rows.append({"input_ids": ids[:length]})
        splits[name] = Table(rows)
    return splits


def pad_for_causal_lm(examples: list[dict[str, Any]], max_length: int, pad_to_multiple_of: int | None = None) -> Batch:
    """Right-pads with the pad token (the examples use EOS as pad) to `max_length`."""
    if pad_to_multiple_of:
        max_length = math.ceil(max_length / pad_to_multiple_of) * pad_to_multiple_of
    ids = [e["input_ids"] + [PAD] * (max_length - len(e["input_ids"])) for e in examples]
    return Batch(input_ids=torch.tensor(ids, dtype=torch.long))


class TinyCausalLM(nn.Module):
    """A tiny next-token model whose loss is summed over tokens and divided by `num_items_in_batch` when given,
    as `transformers` causal LMs do."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.mix = nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        use_cache: bool = False,
        num_items_in_batch: int | None = None,
    ) -> ModelOutput:
        tokens = self.embed(input_ids)
        previous = torch.cat([torch.zeros_like(tokens[:, :1]), tokens[:, :-1]], dim=1)
        logits = self.head(torch.tanh(self.mix(torch.cat([tokens, previous], dim=-1))))
        loss = None
        if labels is not None:
            flat = F.cross_entropy(
                logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
            )
            loss = flat / (num_items_in_batch if num_items_in_batch is not None else labels.ne(IGNORE_INDEX).sum())
        return ModelOutput(loss=loss, logits=logits)


# --- what every script prints last ---


def weight_norm(model: nn.Module) -> float:
    """The L2 norm of all parameters in float64: any difference in the updates shows here."""
    return math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in model.parameters()))


def final_metrics_line(**metrics: Any) -> str:
    """The one JSON line the comparison reads: `{"final_metrics": {...}}`."""
    clean = {k: (float(v) if isinstance(v, (float, np.floating, torch.Tensor)) else v) for k, v in metrics.items()}
    return json.dumps({"final_metrics": clean}, sort_keys=True)
