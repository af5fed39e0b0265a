"""A Hugging Face `transformers` model trained with accel: a tiny BERT (or Llama) built offline from its config,
the usual loop, written as for Accelerate with only the import changed.

    uv run accel launch --cpu -n 2 examples/train_transformers.py            # BERT, 2 CPU processes
    uv run accel launch --cpu -n 2 examples/train_transformers.py --model llama

Nothing is downloaded: the model is `BertForSequenceClassification(BertConfig(...))` with random
weights, and the task is synthetic (is the first half of a token sequence "heavier" than the second?).
Shows `accel.logging.get_logger` (main process only, or every rank in order), `find_executable_batch_size`
around the training function (after an out-of-memory error it tries again with a smaller batch),
`accumulate`, a `transformers` LR schedule and `gather_for_metrics` (each evaluation sample counted once).
`transformers` is only in the workspace's dev group, never a dependency of the accel packages.
"""

from __future__ import annotations

import argparse
import logging

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.logging import get_logger
from accel.utils import find_executable_batch_size, set_seed

logger = get_logger(__name__, log_level="INFO")

VOCAB, LENGTH, PAD = 64, 16, 0


def make_dataset(rows: int, seed: int) -> TensorDataset:
    """Token sequences; label 1 when the first half's token ids sum higher than the second half's."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, LENGTH), generator=generator)
    labels = (ids[:, : LENGTH // 2].sum(1) > ids[:, LENGTH // 2 :].sum(1)).long()
    return TensorDataset(ids, torch.ones_like(ids), labels)


def make_model(kind: str) -> torch.nn.Module:
    """A tiny randomly initialised model from its config: no hub download."""
    if kind == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=LENGTH,
            num_labels=2,
            pad_token_id=PAD,
        )
        return BertForSequenceClassification(config)
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        num_labels=2,
        pad_token_id=PAD,
    )
    return LlamaForSequenceClassification(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["bert", "llama"], default="bert")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="per process, before any halving")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    logger.info(f"{accelerator.num_processes} process(es), model {args.model}")  # printed once, by the main process
    train_set, eval_set = make_dataset(2048, seed=1), make_dataset(301, seed=2)  # 301: uneven over the processes

    @find_executable_batch_size(starting_batch_size=args.batch_size)
    def train(batch_size: int) -> float:
        from transformers import get_linear_schedule_with_warmup

        accelerator.free_memory()  # drop what a failed try had prepared
        set_seed(args.seed)
        model = make_model(args.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True)
        eval_loader = DataLoader(eval_set, batch_size=64)
        scheduler = get_linear_schedule_with_warmup(
            optimizer, num_warmup_steps=10, num_training_steps=len(train_loader) * args.epochs
        )
        model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
            model, optimizer, train_loader, eval_loader, scheduler
        )
        logger.info(
            f"batch size {batch_size}: {len(train_loader)} batches per epoch on this process",
            main_process_only=False,
            in_order=True,
        )

        accuracy = 0.0
        for epoch in range(args.epochs):
            model.train()
            for input_ids, attention_mask, labels in train_loader:
                with accelerator.accumulate(model):
                    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()

            model.eval()
            correct = seen = 0
            for input_ids, attention_mask, labels in eval_loader:
                with torch.no_grad():
                    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
                predictions, references = accelerator.gather_for_metrics((logits.argmax(-1), labels))
                correct += int((predictions == references).sum())
                seen += len(references)
            accuracy = correct / seen
            logger.info(f"epoch {epoch}: train loss {loss.item():.4f} | eval accuracy {accuracy:.3f} on {seen} samples")
        return accuracy

    train()
    accelerator.end_training()


if __name__ == "__main__":
    main()
