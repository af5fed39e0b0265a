"""Train a tiny Llama with transformers' Trainer: the example of docs/frameworks.md, and the Trainer scenarios of
tests/frameworks (scenarios.py imports it). Nothing comes from a hub: the model is built from a config, the
tokenizer is character-level and built here, the data is synthetic.

    python trainer_example.py                         # one process
    torchrun --nproc_per_node 2 trainer_example.py    # two (on CPUs: gloo)

With the `accelerate` shim installed (docs/frameworks.md) the Trainer runs on accel; with Hugging Face's
`accelerate`, on Accelerate: the code is the same.
"""

from __future__ import annotations

import random

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import (
    DataCollatorForLanguageModeling,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

SPECIAL = ["<pad>", "<unk>", "<s>", "</s>"]
WORDS = ["the", "a", "cat", "dog", "bird", "sees", "eats", "likes", "runs", "to", "from", "small", "big", "red"]
WORDS += ["blue", "fish", "tree", "house"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: every character is a token (WordLevel over single characters)."""
    alphabet = sorted(set("".join(WORDS)) | set(" .,!?"))
    vocab = {token: index for index, token in enumerate(SPECIAL + alphabet)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlamaForCausalLM:
    """A two-layer Llama of hidden size 32, initialised from ``seed``."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def sentences(count: int, seed: int = 0) -> list[str]:
    """Synthetic sentences of 3 to 6 words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) + "." for _ in range(count)]


def build_dataset(tokenizer: PreTrainedTokenizerFast, count: int = 128, max_length: int = 40) -> Dataset:
    texts = Dataset.from_dict({"text": sentences(count)})
    return texts.map(
        lambda row: tokenizer(row["text"], truncation=True, max_length=max_length), remove_columns=["text"]
    )


def training_arguments(output_dir: str, **overrides) -> TrainingArguments:
    """Batch 4 per process, 8 optimizer steps, the loss logged at every step, on the CPU, nothing reported."""
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        max_steps=8,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return TrainingArguments(**{**settings, **overrides})


def build_trainer(output_dir: str, **overrides) -> Trainer:
    tokenizer = build_tokenizer()
    return Trainer(
        model=build_model(tokenizer),
        args=training_arguments(output_dir, **overrides),
        train_dataset=build_dataset(tokenizer),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )


if __name__ == "__main__":
    trainer = build_trainer("tiny-llama", gradient_accumulation_steps=2, save_strategy="steps", save_steps=4)
    trainer.train()
    if trainer.is_world_process_zero():
        accelerator = type(trainer.accelerator)
        print("trained with", f"{accelerator.__module__}.{accelerator.__name__}")
        print("losses", [entry["loss"] for entry in trainer.state.log_history if "loss" in entry])
    # Resuming from the step-4 checkpoint repeats steps 5 to 8 exactly.
    build_trainer("tiny-llama", gradient_accumulation_steps=2).train(resume_from_checkpoint="tiny-llama/checkpoint-4")
