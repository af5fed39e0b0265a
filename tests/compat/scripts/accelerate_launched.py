"""A script ported from Accelerate by changing its import, started with the variables `accelerate launch` gives its
workers (tests/compat/accelerate_launch_env.json): what the Accelerator made of them, one JSON line per rank."""

import json
import os
import sys

import torch

from accel import Accelerator

environ_before = dict(os.environ)
accelerator = Accelerator()
# The Accelerator read Accelerate's variables into its settled record; os.environ is left as it was.
environ_changed = sorted(
    name for name in {*environ_before, *os.environ} if environ_before.get(name) != os.environ.get(name)
)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
full_numel = sum(p.numel() for p in model.parameters())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 64)), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for (inputs,) in loader:
    with accelerator.accumulate(model):
        loss = model(inputs).float().pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
state = accelerator.state
report = {
    "rank": accelerator.process_index,
    "mixed_precision": accelerator.mixed_precision,
    "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
    "distributed_type": str(accelerator.distributed_type),
    "compile": accelerator.dynamo_plugin.to_kwargs() if accelerator.dynamo_plugin else None,
    "debug": state.debug,
    # Parameters this process holds (a sharded model holds part of them), and the model's whole count.
    "held_numel": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters()),
    "full_numel": full_numel,
    "environ_changed": environ_changed,
}
if state.fsdp_plugin is not None:
    plugin = state.fsdp_plugin
    report["fsdp"] = {"version": plugin.fsdp_version, "min_num_params": plugin.min_num_params}
if state.deepspeed_plugin is not None:
    config = state.deepspeed_plugin.deepspeed_config
    report["deepspeed"] = {
        "zero_stage": config["zero_optimization"]["stage"],
        "gradient_clipping": config.get("gradient_clipping"),
        "gradient_accumulation_steps": config.get("gradient_accumulation_steps"),
    }
# One write per line: workers share the pipe, and `python -u` would write print's newline separately.
sys.stdout.write("REPORT " + json.dumps(report) + "\n")
accelerator.end_training()
