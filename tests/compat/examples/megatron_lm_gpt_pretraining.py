"""Accelerate's examples/by_feature/megatron_lm_gpt_pretraining.py: causal-LM training where, under Megatron
(`DistributedType.MEGATRON_LM`), the script builds a `MegatronLMDummyScheduler`, reads the total batch size from
`accelerator.state.megatron_lm_plugin.global_batch_size`, averages evaluation losses without gathering (Megatron
averages them over the data-parallel group) and saves with `save_state`; otherwise a linear schedule,
`gather_for_metrics` and the unwrapped model. Same library calls, on synthetic token sequences grouped into
blocks and a tiny GPT instead of a hub GPT-2 checkpoint and a hub dataset.

    accel launch --cpu -n 2 --use-megatron --megatron-tp-degree 2 megatron_lm_gpt_pretraining.py --cpu --output_dir out

The model: Accelerate's `prepare` turns a transformers GPT-2 into Megatron-LM's GPT model (Megatron-LM's model
providers, on GPUs). accel does not convert models: a tensor-parallel model is built from Megatron-core's layers.
`TinyGPT.from_config` stands for `AutoModelForCausalLM.from_config`: under Megatron it builds its MLP from
`ColumnParallelLinear` / `RowParallelLinear` split over the TP group (each rank holding its slices of the same
full weights; the vocabulary head stays replicated, since megatron-core 0.16 gathers a column-parallel output on
CUDA only), otherwise plain `nn.Linear`. Under accel it prints `Megatron tp_degree=2`.

Accelerate 1.15 cannot run this on CPU (its Megatron-LM integration needs Megatron-LM and CUDA), so the
comparison holds accel's TP=2 run (one data-parallel replica) against the reference's plain run on one process:
the same batches and the same updates of the same full weights.
"""

import argparse
import json
import logging
import math
import os
import random
from itertools import chain

import torch
import torch.nn.functional as F
from synthetic import VOCAB, Batch, ModelOutput, final_metrics_line, get_linear_schedule_with_warmup, load_text_datasets
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

if os.environ.get("ACCEL_COMPAT_LIB", "accel") == "accelerate":
    from accelerate import Accelerator, DistributedType
    from accelerate.logging import get_logger
    from accelerate.utils import MegatronLMDummyScheduler, set_seed
else:
    from accel import Accelerator, DistributedType
    from accel.logging import get_logger
    from accel.utils import MegatronLMDummyScheduler, set_seed

logger = get_logger(__name__)
DIM, FFN = 16, 32


class TinyGPT(nn.Module):
    """Embedding -> a tanh MLP block with a residual -> the vocabulary head; labels are shifted inside (GPT-2)."""

    def __init__(self, mlp_in, mlp_out, head, parallel):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mlp_in, self.mlp_out, self.head, self.parallel = mlp_in, mlp_out, head, parallel

    @classmethod
    def from_config(cls, megatron_plugin=None):
        """The full weights from the seed; under Megatron each TP rank keeps its slices of them. The global RNG
        is left as it was (fork_rng), so the data order does not depend on how the layers were built."""
        with torch.random.fork_rng(devices=[]):
            return cls._build(megatron_plugin)

    @classmethod
    def _build(cls, megatron_plugin):
        full = nn.ModuleDict({"in": nn.Linear(DIM, FFN), "out": nn.Linear(FFN, DIM), "head": nn.Linear(DIM, VOCAB)})
        embed = nn.Embedding(VOCAB, DIM).weight.detach().clone()
        if megatron_plugin is None:
            model = cls(full["in"], full["out"], full["head"], parallel=False)
        else:
            from megatron.core import ModelParallelConfig, parallel_state, tensor_parallel

            config = ModelParallelConfig(
                tensor_model_parallel_size=megatron_plugin.tp_degree, use_cpu_initialization=True
            )
            kwargs = {"config": config, "init_method": nn.init.zeros_}
            model = cls(
                tensor_parallel.ColumnParallelLinear(DIM, FFN, gather_output=False, bias=True, **kwargs),
                tensor_parallel.RowParallelLinear(
                    FFN, DIM, input_is_parallel=True, skip_bias_add=False, bias=True, **kwargs
                ),
                full["head"],  # replicated: ColumnParallelLinear(gather_output=True) gathers on CUDA only
                parallel=True,
            )
            rank, size = parallel_state.get_tensor_model_parallel_rank(), megatron_plugin.tp_degree
            with torch.no_grad():
                model.mlp_in.weight.copy_(full["in"].weight.chunk(size, 0)[rank])  # column parallel: split by output
                model.mlp_in.bias.copy_(full["in"].bias.chunk(size, 0)[rank])
                model.mlp_out.weight.copy_(full["out"].weight.chunk(size, 1)[rank])  # row parallel: split by input
                model.mlp_out.bias.copy_(full["out"].bias)
        with torch.no_grad():
            model.embed.weight.copy_(embed)
        return model

    def _linear(self, layer, x):
        return layer(x)[0] if self.parallel and layer is not self.head else layer(x)

    def forward(self, input_ids, labels=None, attention_mask=None):
        hidden = self.embed(input_ids)
        hidden = hidden + self._linear(self.mlp_out, torch.tanh(self._linear(self.mlp_in, hidden)))
        logits = self._linear(self.head, hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        return ModelOutput(loss=loss, logits=logits)

    def save_pretrained(self, save_directory, is_main_process=True, save_function=torch.save):
        if is_main_process:
            save_function(self.state_dict(), os.path.join(save_directory, "pytorch_model.bin"))


def default_data_collator(features):
    return Batch({key: torch.tensor([f[key] for f in features], dtype=torch.long) for key in features[0]})


def get_scheduler(name, optimizer, num_warmup_steps, num_training_steps):
    assert name == "linear", "the port has transformers' linear schedule only"
    return get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps)


def parse_args():
    parser = argparse.ArgumentParser(description="megatron_lm_gpt_pretraining, synthetic")
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
    parser.add_argument("--with_tracking", action="store_true")
    parser.add_argument("--report_to", type=str, default="all")
    return parser.parse_args()


def main():
    args = parse_args()
    accelerator_log_kwargs = {}
    if args.with_tracking:
        accelerator_log_kwargs["log_with"] = args.report_to
        accelerator_log_kwargs["project_dir"] = args.output_dir
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, **accelerator_log_kwargs)
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO
    )
    logger.info(accelerator.state, main_process_only=False)
    if args.seed is not None:
        set_seed(args.seed)
    if accelerator.is_main_process and args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)
    accelerator.wait_for_everyone()

    raw_datasets = load_text_datasets()  # stands for load_dataset(...) + the tokenizer's map
    megatron = accelerator.distributed_type == DistributedType.MEGATRON_LM
    model = TinyGPT.from_config(accelerator.state.megatron_lm_plugin if megatron else None)
    if megatron:  # the port's proof that Megatron's tensor parallelism is engaged
        accelerator.print(f"Megatron tp_degree={accelerator.state.megatron_lm_plugin.tp_degree}")
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

    no_decay = ["bias", "layer_norm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)

    overrode_max_train_steps = False
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
        overrode_max_train_steps = True

    if accelerator.distributed_type == DistributedType.MEGATRON_LM:
        lr_scheduler = MegatronLMDummyScheduler(
            optimizer=optimizer, total_num_steps=args.max_train_steps, warmup_num_steps=args.num_warmup_steps
        )
    else:
        lr_scheduler = get_scheduler(
            name=args.lr_scheduler_type,
            optimizer=optimizer,
            num_warmup_steps=args.num_warmup_steps * args.gradient_accumulation_steps,
            num_training_steps=args.max_train_steps * args.gradient_accumulation_steps,
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
    if args.with_tracking:
        accelerator.init_trackers("clm_no_trainer", vars(args))

    if accelerator.distributed_type == DistributedType.MEGATRON_LM:
        total_batch_size = accelerator.state.megatron_lm_plugin.global_batch_size
    else:
        total_batch_size = (
            args.per_device_train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
        )
    logger.info("***** Running training *****")
    logger.info(f"  Num examples = {len(train_dataset)}")
    logger.info(f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch_size}")
    logger.info(f"  Total optimization steps = {args.max_train_steps}")
    progress_bar = tqdm(range(args.max_train_steps), disable=not accelerator.is_local_main_process)
    completed_steps = 0
    starting_epoch = 0
    resume_step = None
    if args.resume_from_checkpoint:
        accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
        accelerator.load_state(args.resume_from_checkpoint)
        training_difference = os.path.splitext(os.path.basename(args.resume_from_checkpoint))[0]
        if "epoch" in training_difference:
            starting_epoch = int(training_difference.replace("epoch_", "")) + 1
        else:
            resume_step = int(training_difference.replace("step_", "")) * args.gradient_accumulation_steps
            starting_epoch = resume_step // len(train_dataloader)
            resume_step -= starting_epoch * len(train_dataloader)
    progress_bar.update(starting_epoch * num_update_steps_per_epoch)
    completed_steps = starting_epoch * num_update_steps_per_epoch

    for epoch in range(starting_epoch, args.num_train_epochs):
        model.train()
        if args.with_tracking:
            total_loss = 0
        for step, batch in enumerate(train_dataloader):
            if args.resume_from_checkpoint and epoch == starting_epoch:  # noqa: SIM102  (the reference's shape)
                if resume_step is not None and step < resume_step:
                    if step % args.gradient_accumulation_steps == 0:
                        progress_bar.update(1)
                        completed_steps += 1
                    continue
            with accelerator.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                if args.with_tracking:
                    total_loss += loss.detach().float()
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                progress_bar.update(1)
                completed_steps += 1
            if isinstance(checkpointing_steps, int) and completed_steps % checkpointing_steps == 0:
                output_dir = f"step_{completed_steps}"
                if args.output_dir is not None:
                    output_dir = os.path.join(args.output_dir, output_dir)
                accelerator.save_state(output_dir)
            if completed_steps >= args.max_train_steps:
                break

        model.eval()
        losses = []
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            loss_eval = outputs.loss
            if accelerator.distributed_type == DistributedType.MEGATRON_LM:
                losses.append(loss_eval)
            else:
                losses.append(accelerator.gather_for_metrics(loss_eval.repeat(args.per_device_eval_batch_size)))
        try:
            if accelerator.distributed_type == DistributedType.MEGATRON_LM:
                losses = torch.tensor(losses)
            else:
                losses = torch.cat(losses)
            eval_loss = torch.mean(losses)
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        logger.info(f"epoch {epoch}: perplexity: {perplexity} eval_loss: {eval_loss}")
        if args.with_tracking:
            accelerator.log({"perplexity": perplexity, "eval_loss": eval_loss, "epoch": epoch}, step=completed_steps)
        if args.checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)

    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        if accelerator.distributed_type == DistributedType.MEGATRON_LM:
            accelerator.save_state(args.output_dir)
        else:
            unwrapped_model = accelerator.unwrap_model(model)
            unwrapped_model.save_pretrained(
                args.output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save
            )
        with open(os.path.join(args.output_dir, "all_results.json"), "w") as f:
            json.dump({"perplexity": perplexity}, f)
    full_state = accelerator.get_state_dict(model)  # the port's metric: the full (TP-gathered) weights
    accelerator.print(
        final_metrics_line(
            perplexity=perplexity,
            eval_loss=eval_loss.item(),
            last_loss=loss.item(),
            lr=lr_scheduler.get_last_lr()[0],
            completed_steps=completed_steps,
            total_batch_size=total_batch_size,
            weight_norm=math.sqrt(sum(float(v.double().pow(2).sum()) for v in full_state.values())),
        )
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
