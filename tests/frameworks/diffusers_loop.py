"""A diffusers training loop in the shape of diffusers' examples/text_to_image/train_text_to_image.py, on a tiny
UNet2DConditionModel built from a config and synthetic latents and text embeddings (no VAE, no text encoder, no
hub): `Accelerator(gradient_accumulation_steps=2, project_config=...)`, an EMAModel of the UNet, the example's
`register_save_state_pre_hook` / `register_load_state_pre_hook` hooks (the UNet and its EMA saved with
`save_pretrained`, loaded back with `from_pretrained`), the loss gathered over the processes as the example logs it,
`save_state` after the first epoch and a second run resuming from it with `load_state`.

scenarios.py runs it; it returns the logged losses and the digests of the weights and of the EMA weights, of the
uninterrupted run and of the resumed one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from diffusers import DDPMScheduler, UNet2DConditionModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel
from digests import digest

SAMPLES = 32
EPOCHS = 2
GRADIENT_ACCUMULATION = 2
BATCH = 2


def tiny_unet() -> UNet2DConditionModel:
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=2,
        norm_num_groups=4,
    )


def synthetic_data() -> list[dict[str, torch.Tensor]]:
    """Latents (4 x 8 x 8) and text embeddings (6 tokens x 16) in place of the VAE's and the text encoder's."""
    generator = torch.Generator().manual_seed(1)
    return [
        {"latents": torch.randn(4, 8, 8, generator=generator), "text": torch.randn(6, 16, generator=generator)}
        for _ in range(SAMPLES)
    ]


def train(folder: str, resume_from: str | None = None) -> dict:
    # cpu=True, as `accelerate launch --cpu` sets it: without it, Accelerate under torchrun on a machine without a
    # GPU runs each process alone (seen: both ranks process 0, each on all the data), where accel joins the job.
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=GRADIENT_ACCUMULATION,
        project_config=ProjectConfiguration(project_dir=folder, logging_dir=f"{folder}/logs"),
    )
    set_seed(0)
    noise_scheduler = DDPMScheduler(num_train_timesteps=100)
    unet = tiny_unet()
    ema_unet = EMAModel(unet.parameters(), model_cls=UNet2DConditionModel, model_config=unet.config)

    # The example's hooks: the UNet and its EMA as diffusers folders instead of the Accelerator's default files.
    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            ema_unet.save_pretrained(os.path.join(output_dir, "unet_ema"))
            for model in models:
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()  # the hook saved this model: the Accelerator must not save it again

    def load_model_hook(models, input_dir):
        loaded = EMAModel.from_pretrained(os.path.join(input_dir, "unet_ema"), UNet2DConditionModel)
        ema_unet.load_state_dict(loaded.state_dict())
        ema_unet.to(accelerator.device)
        del loaded
        for _ in range(len(models)):
            model = models.pop()  # the hook loads this model: the Accelerator must not load it again
            loaded = UNet2DConditionModel.from_pretrained(input_dir, subfolder="unet")
            model.register_to_config(**loaded.config)
            model.load_state_dict(loaded.state_dict())
            del loaded

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)

    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(synthetic_data(), batch_size=BATCH, shuffle=True)
    lr_scheduler = get_scheduler("constant", optimizer=optimizer)
    unet, optimizer, loader, lr_scheduler = accelerator.prepare(unet, optimizer, loader, lr_scheduler)
    ema_unet.to(accelerator.device)
    steps_per_epoch = len(loader) // GRADIENT_ACCUMULATION

    global_step, first_epoch = 0, 0
    if resume_from is not None:
        accelerator.load_state(resume_from)
        global_step = int(resume_from.rsplit("-", 1)[1])
        first_epoch = global_step // steps_per_epoch

    losses: dict[str, float] = {}
    for _epoch in range(first_epoch, EPOCHS):
        unet.train()
        train_loss = 0.0
        for batch in loader:
            with accelerator.accumulate(unet):
                latents = batch["latents"]
                noise = torch.randn_like(latents)
                timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (latents.shape[0],))
                noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
                model_pred = unet(noisy_latents, timesteps, batch["text"], return_dict=False)[0]
                loss = F.mse_loss(model_pred.float(), noise.float(), reduction="mean")
                # The example's logged loss: gathered over the processes, averaged over the accumulation.
                average = accelerator.gather(loss.repeat(BATCH)).mean()
                train_loss += average.item() / GRADIENT_ACCUMULATION
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(unet.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                ema_unet.step(unet.parameters())
                global_step += 1
                losses[str(global_step)] = train_loss
                train_loss = 0.0
                if global_step == steps_per_epoch and resume_from is None:
                    accelerator.save_state(os.path.join(folder, f"checkpoint-{global_step}"))
    accelerator.wait_for_everyone()
    weights = digest(accelerator.unwrap_model(unet).parameters())
    accelerator_class = f"{type(accelerator).__module__}.{type(accelerator).__qualname__}"
    report = {"losses": losses, "weights": digest(ema_unet.shadow_params), "accelerator": accelerator_class}
    report["unet_weights"] = weights
    report["checkpoint_files"] = sorted(os.listdir(os.path.join(folder, f"checkpoint-{steps_per_epoch}")))
    report["steps"] = global_step
    return report


def run(folder: str, between_runs: Callable[[], None]) -> dict:
    """The uninterrupted run and the resumed one; ``between_runs`` makes the second start as a new process would."""
    whole = train(folder)
    between_runs()
    resumed = train(folder, resume_from=os.path.join(folder, f"checkpoint-{len(whole['losses']) // EPOCHS}"))
    return {"diffusers": whole, "diffusers_resumed_after_epoch_1": resumed}
