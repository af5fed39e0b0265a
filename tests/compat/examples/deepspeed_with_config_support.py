"""Accelerate's examples/by_feature/deepspeed_with_config_support.py: causal-LM fine-tuning where the DeepSpeed JSON
config (given to the launcher) holds the optimizer and the scheduler, so the script builds `DummyOptim` /
`DummyScheduler` when `accelerator.state.deepspeed_plugin.deepspeed_config` has them and torch's AdamW / a linear
schedule otherwise; `accumulate`, `reduce`, `gather_for_metrics`, a `save_state` of the best epoch, `load_state`
of it (`--load_best_model`), `get_state_dict` + `save` of the full weights. Same library calls, on synthetic
token sequences grouped into blocks and a tiny causal LM instead of a hub GPT-2 and a hub dataset.

With its config (deepspeed_config_templates/zero_stage2_config.json, Accelerate's ZeRO-2 template with
`"warmup_type": "linear"` and fp16 "auto", see tests/compat/README.md):

    accel launch --cpu -n 2 --use_deepspeed --deepspeed_config_file deepspeed_config_templates/zero_stage2_config.json \
        deepspeed_with_config_support.py --cpu --output_dir out --num_warmup_steps 4 --load_best_model

Under DeepSpeed it prints `DeepSpeedEngine zero_stage=2`. Accelerate 1.15 does not run DeepSpeed on `--cpu` (it
runs the script as MULTI_CPU data parallelism with torch's AdamW and the linear schedule), so the comparison
holds accel's ZeRO-2 run against that plain data-parallel run.
"""

import argparse
import json
import logging
import math
import os
import random
from itertools import chain
from types import SimpleNamespace

import torch
from synthetic import Batch, TinyCausalLM, final_metrics_line, get_linear_schedule_with_warmup, load_text_datasets
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DistributedType
    from accelerate.logging import get_logger
    from accelerate.utils import DummyOptim, DummyScheduler, set_seed
else:
    from accel import Accelerator, DistributedType
    from accel.logging import get_logger
    from accel.utils import DummyOptim, DummyScheduler, set_seed

logger = get_logger(__name__)


class TinyGPTForCausalLM(TinyCausalLM):
    """The tiny causal LM called like `AutoModelForCausalLM`: labels are the inputs (shifted inside, as GPT-2 does),
    `config.hidden_size` (DeepSpeed's "auto" bucket sizes are read from it, as from a transformers model), and
    `save_pretrained(dir, is_main_process=, save_function=, state_dict=)` writes the given state dict."""

    def __init__(self, dim=16):
        super().__init__(dim)
        self.config = SimpleNamespace(hidden_size=dim)

    def forward(self, input_ids, labels=None, attention_mask=None):
        out = super().forward(input_ids)
        if labels is not None:
            logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1])
            out.loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1))
        return out

    def save_pretrained(self, save_directory, is_main_process=True, save_function=torch.save, state_dict=None):
        if is_main_process:
            save_function(state_dict or self.state_dict(), os.path.join(save_directory, "pytorch_model.bin"))


def default_data_collator(features):
    return Batch({key: torch.tensor([f[key] for f in features], dtype=torch.long) for key in features[0]})


def get_scheduler(name, optimizer, num_warmup_steps, num_training_steps):
    assert name == "linear", "the port has transformers' linear schedule only"
    return get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps)


def parse_args():
    parser = argparse.ArgumentParser(description="deepspeed_with_config_support, synthetic")
    parser.add_argument("--cpu", action="store_true", help="accepted as in the other ports (the launcher's --cpu acts)")
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=1e-2)
    parser.add_argument("--weight_decay", type=float, default=0.0)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--lr_scheduler_type", type=str, default="linear")
    parser.add_argument("--num_warmup_steps", type=int, default=0)
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--block_size", type=int, default=16)
    parser.add_argument("--checkpointing_steps", type=str, default=None)
    parser.add_argument("--resume_from_checkpoint", type=str, default=None)
    parser.add_argument("--load_best_model", action="store_true")
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--report_to", type=str, default="all")
    return parser.parse_args()


def evaluate(args, model, eval_dataloader, accelerator, eval_dataset):
    model.eval()
    losses = []
    for step, batch in enumerate(eval_dataloader):
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
    return perplexity, eval_loss


def main():
    args = parse_args()
    accelerator = (
        Accelerator(
            log_with=args.report_to,
            project_dir=args.output_dir,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
        )
        if args.with_tracking
        else Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    )
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO
    )
    logger.info(accelerator.state, main_process_only=False)
    accelerator.print(accelerator.distributed_type)
    if args.seed is not None:
        set_seed(args.seed)
    if accelerator.is_main_process and args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()

    raw_datasets = load_text_datasets()  # stands for load_dataset(...) + the tokenizer's map
    model = TinyGPTForCausalLM()
    block_size = args.block_size

    def group_texts(rows):
        concatenated = list(chain(*(row["input_ids"] for row in rows)))
        total_length = (len(concatenated) // block_size) * block_size
        blocks = [concatenated[i : i + block_size] for i in range(0, total_length, block_size)]
        return [{"input_ids": block, "labels": list(block)} for block in blocks]

    with accelerator.main_process_first():
        lm_datasets = {name: group_texts(split.rows) for name, split in raw_datasets.items()}
    train_dataset, eval_dataset = lm_datasets["train"], lm_datasets["validation"]
    for index in random.sample(range(len(train_dataset)), 3):
        logger.info(f"Sample {index} of the training set: {train_dataset[index]}.")

    train_dataloader = DataLoader(
        train_dataset, shuffle=True, collate_fn=default_data_collator, batch_size=args.per_device_train_batch_size
    )
    eval_dataloader = DataLoader(
        eval_dataset, collate_fn=default_data_collator, batch_size=args.per_device_eval_batch_size
    )

    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer_cls = (
        torch.optim.AdamW
        if accelerator.state.deepspeed_plugin is None
        or "optimizer" not in accelerator.state.deepspeed_plugin.deepspeed_config
        else DummyOptim
    )
    optimizer = optimizer_cls(optimizer_grouped_parameters, lr=args.learning_rate)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.gradient_accumulation_steps)
    overrode_max_train_steps = False
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
        overrode_max_train_steps = True
    else:
        args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    if (
        accelerator.state.deepspeed_plugin is None
        or "scheduler" not in accelerator.state.deepspeed_plugin.deepspeed_config
    ):
        lr_scheduler = get_scheduler(
            name=args.lr_scheduler_type,
            optimizer=optimizer,
            num_warmup_steps=args.num_warmup_steps,
            num_training_steps=args.max_train_steps,
        )
    else:
        lr_scheduler = DummyScheduler(
            optimizer, total_num_steps=args.max_train_steps, warmup_num_steps=args.num_warmup_steps
        )

    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:  # the port's proof that DeepSpeed is engaged
        accelerator.print(f"{type(model).__name__} zero_stage={model.zero_optimization_stage()}")

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.gradient_accumulation_steps)
    if overrode_max_train_steps:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    checkpointing_steps = args.checkpointing_steps
    if checkpointing_steps is not None and checkpointing_steps.isdigit():
        checkpointing_steps = int(checkpointing_steps)
    if args.with_tracking:
        accelerator.init_trackers("clm_no_trainer", vars(args))

    total_batch_size = (
        args.per_device_train_batch_size * accelerator.num_processes * accelerator.gradient_accumulation_steps
    )
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_dataset)}")
    logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size}")
    logger.info(f"  Total optimization steps = {args.max_train_steps}")
    progress_bar = tqdm(range(args.max_train_steps), disable=not accelerator.is_local_main_process)
    completed_steps = 0
    starting_epoch = 0
    best_metric = None
    best_metric_checkpoint = None

    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
        accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
        path = os.path.basename(args.resume_from_checkpoint)
        training_difference = os.path.splitext(path)[0]
        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
            resume_step = None
            completed_steps = starting_epoch * num_update_steps_per_epoch
        else:
            resume_step = int(training_difference.replace("step_", ""))
            starting_epoch = resume_step // num_update_steps_per_epoch
            resume_step -= starting_epoch * num_update_steps_per_epoch
            completed_steps = resume_step

    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        if args.with_tracking:
            total_loss = 0
        if args.resume_from_checkpoint:
            train_dataloader = accelerator.skip_first_batches(train_dataloader, num_batches=resume_step)
        for step, batch in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                if accelerator.sync_gradients:
                    progress_bar.update(1)
                    completed_steps += 1
            if args.with_tracking:
                step_loss = accelerator.reduce(loss.detach().clone()).item()
                total_loss += step_loss
            if isinstance(checkpointing_steps, int) and completed_steps % checkpointing_steps == 0:
                output_dir = f"step_{completed_steps}"
                if args.output_dir is not None:
                    output_dir = os.path.join(args.output_dir, output_dir)
                accelerator.save_state(output_dir)
            if completed_steps >= args.max_train_steps:
                break

        perplexity, eval_loss = evaluate(args, model, eval_dataloader, accelerator, eval_dataset)
        logger.info(f"epoch {epoch}: perplexity: {perplexity} eval_loss: {eval_loss}")
        if args.with_tracking:
            accelerator.log(
                {"perplexity": perplexity, "eval_loss": eval_loss, "epoch": epoch, "step": completed_steps},
                step=completed_steps,
            )
        if isinstance(checkpointing_steps, str) and checkpointing_steps == "epoch":
            accelerator.save_state(os.path.join(args.output_dir, f"epoch_{epoch}"))
        if best_metric is None or best_metric > perplexity:
            best_metric = perplexity
            best_metric_checkpoint = os.path.join(args.output_dir, "best_checkpoint")
            accelerator.save_state(best_metric_checkpoint)
            accelerator.print(f"New best metric: {best_metric} at epoch {epoch}")
            accelerator.print(f"best_metric_checkpoint: {best_metric_checkpoint}")

    if args.load_best_model:
        accelerator.load_state(best_metric_checkpoint)
    perplexity, eval_loss = evaluate(args, model, eval_dataloader, accelerator, eval_dataset)
    logger.info(f"Best model metrics: perplexity: {perplexity} eval_loss: {eval_loss}")
    if perplexity != best_metric:
        raise AssertionError(
            f"Best metric {best_metric} does not match the metric {perplexity} of the loaded best model."
        )

    full_state = accelerator.get_state_dict(model)
    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        unwrapped_model = accelerator.unwrap_model(model)
        unwrapped_model.save_pretrained(
            args.output_dir,
            is_main_process=accelerator.is_main_process,
            save_function=accelerator.save,
            state_dict=full_state,
        )
        with open(os.path.join(args.output_dir, "all_results.json"), "w") as f:
            json.dump({"perplexity": perplexity, "eval_loss": eval_loss.item()}, f)
    accelerator.print(
        final_metrics_line(
            perplexity=perplexity,
            eval_loss=eval_loss.item(),
            best_metric=best_metric,
            last_loss=loss.item(),
            lr=lr_scheduler.get_last_lr()[0],
            completed_steps=completed_steps,
            weight_norm=math.sqrt(sum(float(v.double().pow(2).sum()) for v in full_state.values())),
        )
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
