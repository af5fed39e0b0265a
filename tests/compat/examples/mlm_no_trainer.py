"""transformers' examples/pytorch/language-modeling/run_mlm_no_trainer.py (masked language modelling from scratch,
checkpoints by step, resume with load_state + skip_first_batches), same library calls in the same order, offline.

The reference script reads a hub dataset and tokenizer; here a synthetic text (numpy, fixed seed), a BERT WordPiece
tokenizer built from a vocabulary file, and a tiny randomly initialised BertForMaskedLM (dropout 0.1, as BERT's
default). What the comparison is about: `DataCollatorForLanguageModeling` masks each batch with torch's global RNG
while it is collated, and the model's dropout draws from the same RNG, so the order in which the prepared loader
collates batches and the training steps run shows in every number (Accelerate's loader collates batch n+1 before it
hands out batch n).

Run: accel launch --cpu -n 2 mlm_no_trainer.py --checkpointing_steps 5 --output_dir out
     then again with --resume_from_checkpoint out/step_10 (ACCEL_COMPAT_LIB=accelerate for the reference).
"""

import argparse
import math
import os
import tempfile
from itertools import chain

import numpy as np
import torch
from synthetic import final_metrics_line, weight_norm
from torch.utils.data import DataLoader

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import set_seed
else:
    from accel import Accelerator
    from accel.utils import set_seed

WORDS = [f"w{i}" for i in range(60)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def synthetic_text(lines: int, seed: int) -> list[str]:
    """Sentences with some structure (a word tends to follow its predecessor + 1) for the model to learn."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(lines):
        word = int(rng.randint(len(WORDS)))
        sentence = []
        for _ in range(int(rng.randint(5, 14))):
            sentence.append(WORDS[word])
            word = (word + 1) % len(WORDS) if rng.rand() < 0.5 else int(rng.randint(len(WORDS)))
        out.append(" ".join(sentence))
    return out


def make_tokenizer():
    from transformers import BertTokenizerFast

    folder = tempfile.mkdtemp(prefix="mlm-vocab-")
    path = os.path.join(folder, "vocab.txt")
    with open(path, "w") as handle:
        handle.write("\n".join(SPECIAL + WORDS) + "\n")
    return BertTokenizerFast(vocab_file=path, do_lower_case=False, model_max_length=512)


def parse_args():
    parser = argparse.ArgumentParser(description="Masked language modelling, run_mlm_no_trainer's calls, offline.")
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--num_warmup_steps", type=int, default=2)
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max_seq_length", type=int, default=16)
    parser.add_argument("--mlm_probability", type=float, default=0.15)
    parser.add_argument("--checkpointing_steps", type=str, default=None)
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    # The comparison's launcher passes --cpu to every example; the launch (accel launch --cpu, ACCELERATE_USE_CPU)
    # already puts this run on the CPU, as the reference script relies on.
    parser.add_argument("--cpu", action="store_true")
    return parser.parse_args()


def main():
    from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling, get_scheduler

    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    if args.seed is not None:
        set_seed(args.seed)
    if accelerator.is_main_process and args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()

    raw = {"train": synthetic_text(240, seed=7), "validation": synthetic_text(40, seed=8)}
    tokenizer = make_tokenizer()
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = BertForMaskedLM(config)  # from scratch, as the script's --model_type path
    model.resize_token_embeddings(len(tokenizer))

    # The script's default (not line_by_line) preprocessing: tokenize with special-token masks, concatenate,
    # cut into blocks of max_seq_length.
    max_seq_length = args.max_seq_length

    def tokenize_and_group(texts: list[str]) -> list[dict[str, list[int]]]:
        encoded = tokenizer(texts, return_special_tokens_mask=True)
        concatenated = {k: list(chain(*encoded[k])) for k in encoded}
        total_length = (len(concatenated["input_ids"]) // max_seq_length) * max_seq_length
        columns = {
            k: [t[i : i + max_seq_length] for i in range(0, total_length, max_seq_length)]
            for k, t in concatenated.items()
        }
        return [{k: columns[k][i] for k in columns} for i in range(len(columns["input_ids"]))]

    with accelerator.main_process_first():
        train_dataset = tokenize_and_group(raw["train"])
        eval_dataset = tokenize_and_group(raw["validation"])

    data_collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=args.mlm_probability)
    train_dataloader = DataLoader(
        train_dataset, shuffle=True, collate_fn=data_collator, batch_size=args.per_device_train_batch_size
    )
    eval_dataloader = DataLoader(eval_dataset, collate_fn=data_collator, batch_size=args.per_device_eval_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)

    overrode_max_train_steps = False
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
        overrode_max_train_steps = True
    lr_scheduler = get_scheduler(
        name="linear",
        optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
        num_training_steps=args.max_train_steps
        if overrode_max_train_steps
        else args.max_train_steps * accelerator.num_processes,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if overrode_max_train_steps:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    checkpointing_steps = args.checkpointing_steps
    if checkpointing_steps is not None and checkpointing_steps.isdigit():
        checkpointing_steps = int(checkpointing_steps)

    completed_steps = 0
    starting_epoch = 0
    resume_step = None
    if args.resume_from_checkpoint:
        checkpoint_path = args.resume_from_checkpoint
        path = os.path.basename(args.resume_from_checkpoint)
        accelerator.print(f"Resumed from checkpoint: {checkpoint_path}")
        accelerator.load_state(checkpoint_path)
        training_difference = os.path.splitext(path)[0]
        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
            resume_step = None
            completed_steps = starting_epoch * num_update_steps_per_epoch
        else:
            resume_step = int(training_difference.replace("step_", "")) * args.gradient_accumulation_steps
            starting_epoch = resume_step // len(train_dataloader)
            completed_steps = resume_step // args.gradient_accumulation_steps
            resume_step -= starting_epoch * len(train_dataloader)

    perplexity, eval_loss, train_loss = float("nan"), float("nan"), 0.0
    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        else:
            active_dataloader = train_dataloader
        for batch in active_dataloader:
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                train_loss = loss.item()
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
            if isinstance(checkpointing_steps, int):  # noqa: SIM102 - the reference's nesting
                if completed_steps % checkpointing_steps == 0 and accelerator.sync_gradients:
                    output_dir = f"step_{completed_steps}"
                    if args.output_dir is not None:
                        output_dir = os.path.join(args.output_dir, output_dir)
                    accelerator.save_state(output_dir)
            if completed_steps >= args.max_train_steps:
                break

        model.eval()
        losses = []
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            loss = outputs.loss
            losses.append(accelerator.gather_for_metrics(loss.repeat(args.per_device_eval_batch_size)))
        losses = torch.cat(losses)
        try:
            eval_loss = torch.mean(losses)
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        accelerator.print(f"epoch {epoch}: perplexity: {perplexity} eval_loss: {eval_loss}")
        if args.checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)

    accelerator.wait_for_everyone()
    accelerator.print(
        final_metrics_line(
            perplexity=perplexity,
            eval_loss=eval_loss,
            last_train_loss=train_loss,
            overall_step=completed_steps,
            lr=lr_scheduler.get_last_lr()[0],
            weight_norm=weight_norm(accelerator.unwrap_model(model)),
        )
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
