"""Every framework scenario of tests/frameworks in one launch: transformers' Trainer (plain, gradient accumulation,
save and resume), PEFT LoRA through Trainer, TRL's SFTTrainer and DPOTrainer, and a diffusers text-to-image loop.
Run as ``python scenarios.py OUT.json`` or under ``torchrun --nproc_per_node 2``, in either frameworks environment
(tests/frameworks/setup.sh): on accel (the `accelerate` shim) or on Hugging Face's Accelerate. The process of rank 0
writes, per scenario, the loss logged at every step, a digest of the trained weights and what answered
`import accelerate`; test_frameworks.py runs this in both environments and compares.

One launch per (environment, number of processes): importing torch and the frameworks costs seconds per process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import diffusers_loop
import trainer_example
from digests import digest


def losses(trainer) -> dict[str, float]:
    return {str(entry["step"]): entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def report(trainer) -> dict:
    accelerator = type(trainer.accelerator)
    return {
        "losses": losses(trainer),
        "weights": digest(p for p in trainer.model.parameters() if p.requires_grad),
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "accelerator": f"{accelerator.__module__}.{accelerator.__qualname__}",
        "steps": trainer.state.global_step,
    }


def trainer_scenarios(folder: str) -> dict[str, dict]:
    results = {}
    results["trainer_plain"] = report(_train(trainer_example.build_trainer(f"{folder}/plain")))
    # Accumulation 2, a checkpoint at step 4 of 8: the uninterrupted run, then a new Trainer resuming from it.
    whole = trainer_example.build_trainer(
        f"{folder}/ga2", gradient_accumulation_steps=2, save_strategy="steps", save_steps=4
    )
    results["trainer_accumulation_2"] = report(_train(whole))
    resumed = trainer_example.build_trainer(f"{folder}/ga2", gradient_accumulation_steps=2)
    resumed.train(resume_from_checkpoint=f"{folder}/ga2/checkpoint-4")
    results["trainer_resumed_from_step_4"] = report(resumed)
    return results


def _train(trainer):
    trainer.train()
    return trainer


def peft_lora(folder: str) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForLanguageModeling, Trainer

    tokenizer = trainer_example.build_tokenizer()
    model = get_peft_model(
        trainer_example.build_model(tokenizer),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM"),
    )
    trainer = Trainer(
        model=model,
        args=trainer_example.training_arguments(f"{folder}/lora", learning_rate=1e-2),
        train_dataset=trainer_example.build_dataset(tokenizer),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    return report(_train(trainer))


def trl_sft(folder: str) -> dict:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = trainer_example.build_tokenizer()
    settings = trainer_example.training_arguments(f"{folder}/sft").to_dict()
    args = SFTConfig(**_own_fields(SFTConfig, settings), max_length=40, packing=False, dataset_text_field="text")
    trainer = SFTTrainer(
        model=trainer_example.build_model(tokenizer),
        args=args,
        train_dataset=Dataset.from_dict({"text": trainer_example.sentences(128)}),
        processing_class=tokenizer,
    )
    return report(_train(trainer))


def trl_dpo(folder: str) -> dict:
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    tokenizer = trainer_example.build_tokenizer()
    texts = trainer_example.sentences(3 * 64, seed=1)
    pairs = Dataset.from_dict({"prompt": texts[0::3], "chosen": texts[1::3], "rejected": texts[2::3]})
    settings = trainer_example.training_arguments(f"{folder}/dpo").to_dict()
    args = DPOConfig(**_own_fields(DPOConfig, settings), max_length=64, beta=0.1)
    trainer = DPOTrainer(
        model=trainer_example.build_model(tokenizer),
        ref_model=trainer_example.build_model(tokenizer),
        args=args,
        train_dataset=pairs,
        processing_class=tokenizer,
    )
    return report(_train(trainer))


def _own_fields(config_class, settings: dict) -> dict:
    """The settings of ``training_arguments`` that ``config_class`` (a TrainingArguments subclass) takes."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(config_class) if field.init}
    keys = ("output_dir", "per_device_train_batch_size", "max_steps", "learning_rate", "logging_steps",
            "save_strategy", "report_to", "use_cpu", "seed", "disable_tqdm", "dataloader_num_workers")  # fmt: skip
    return {key: settings[key] for key in keys if key in names}


def what_answers_import_accelerate() -> dict:
    """Which distribution and files `import accelerate` reads, without trusting the package's own word."""
    spec = importlib.util.find_spec("accelerate")
    assert spec is not None and spec.origin is not None
    package = Path(spec.origin).parent
    return {
        "distribution": importlib.metadata.version("accelerate"),
        "has_accelerator_py": (package / "accelerator.py").exists(),
        "accelerate_accelerator_module": __import__("accelerate.accelerator", fromlist=["_"]).__name__,
    }


def fresh_process_state() -> None:
    """Forgets the process state an earlier Accelerator left (Accelerate's and accel's state objects are shared by
    every Accelerator of a process), as a scenario of its own process would start: the process group stays. Seen
    without it: Accelerate's diffusers loop after the Trainer scenarios logged other losses than on its own."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


SCENARIOS = {
    "trainer": trainer_scenarios,
    "peft_lora": peft_lora,
    "trl_sft": trl_sft,
    "trl_dpo": trl_dpo,
    "diffusers": lambda folder: diffusers_loop.run(folder, between_runs=fresh_process_state),
}


def main() -> None:
    out = Path(sys.argv[1])
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SCENARIOS)
    torch.set_num_threads(1)
    results: dict = {"import_accelerate": what_answers_import_accelerate(), "world_size": 1}
    with tempfile.TemporaryDirectory() as scratch:
        # One folder for all ranks (rank 0 makes it, the others learn its name from the environment's shared path).
        folder = os.environ.get("FRAMEWORKS_SCRATCH", scratch)
        for name in chosen:
            fresh_process_state()
            found = SCENARIOS[name](f"{folder}/{name}")
            results.update(found if name in ("trainer", "diffusers") else {name: found})
    if torch.distributed.is_initialized():
        results["world_size"] = torch.distributed.get_world_size()
        if torch.distributed.get_rank() != 0:
            return
    out.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
