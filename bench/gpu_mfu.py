"""MFU of a ~1B-parameter Llama-style model under FSDP2 + bf16 + torch.compile: accel against the same loop in raw
PyTorch (fully_shard + MixedPrecisionPolicy + per-block compile, torchtitan's recipe), measured side by side.

    torchrun --nproc_per_node 8 bench/gpu_mfu.py                    # a GPU machine, unchanged
    ACCEL_USE_CPU=true torchrun --nproc_per_node 2 bench/gpu_mfu.py --tiny --no-compile   # proves it runs (CPU)

Both variants build the same model from the same seed and train on the same random tokens, with the same FSDP2
settings (like for like): every block and the root reshard after forward, as accel's FSDP2 does (its plugin's
FULL_SHARD; a root left gathered would hand its unsharded tensors to an evaluation between steps), where
fully_shard's default would keep the root gathered and save one all-gather of the root per step. Each JSON line
says what its variant ran with (``reshard_after_forward`` of the root and of the blocks, read back from FSDP2).
Rounds alternate (which one goes first swaps each round). MFU = model FLOPs per second / (processes x peak bf16
FLOP/s), with model FLOPs per token = 6 x non-embedding parameters + 12 x layers x hidden x sequence (attention),
PaLM's accounting (the embedding is a lookup, not a matmul; the output projection counts). The peak comes from
--peak-tflops or, on a known GPU, from the table below (dense bf16, by the name's most specific match: an H100
PCIe or NVL is not an SXM H100); on a CPU MFU is not reported. Prints one JSON line per variant and the ratio
accel / raw, with each variant's peak GPU memory over its timed steps (both models are resident). Not yet run on
a GPU (no GPU machine was available); bench/gpu_lane.py runs it as one case.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# Dense bf16 peaks (NVIDIA's data sheets, without sparsity). Matched against torch.cuda.get_device_name: the longest
# key found in the name wins, so "NVIDIA H100 PCIe" is a PCIe part, "NVIDIA H100 80GB HBM3" an SXM one.
PEAK_BF16_TFLOPS = {
    "H100": 989.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.0,
    "H200 NVL": 835.0,
    "H800": 989.0,
    "H800 PCIe": 756.0,
    "GH200": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "B200": 2250.0,
}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.gate, self.up, self.down = (
            nn.Linear(dim, ffn, bias=False),
            nn.Linear(dim, ffn, bias=False),
            nn.Linear(ffn, dim, bias=False),
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    _no_split_modules: ClassVar[list[str]] = ["LlamaBlock"]

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, ffn: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, dim // heads, 2).float() / (dim // heads)))
        angles = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, self.cos.to(x.dtype), self.sin.to(x.dtype))
        return self.head(self.norm(x))


def build(config: dict, device: torch.device) -> Llama:
    torch.manual_seed(0)
    with torch.device(device):
        return Llama(**config)


def raw_prepare(model: Llama, compile_blocks: bool, reshard_after_forward: bool | int) -> Llama:
    """torchtitan's recipe by hand, with accel's reshard_after_forward (given) on every block and on the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        if compile_blocks:
            block.compile()
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def reshards_after_forward(module: nn.Module) -> bool:
    """Whether FSDP2 frees ``module``'s gathered parameters after its forward (read from FSDP2's state: what ran)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        return False
    group = module._get_fsdp_state()._fsdp_param_group
    return group is not None and group.post_forward_mesh_info is not None


def fsdp_settings(model: Llama) -> dict[str, bool]:
    return {
        "root_reshard_after_forward": reshards_after_forward(model),
        "blocks_reshard_after_forward": all(reshards_after_forward(block) for block in model.layers),
    }


def flops_per_token(model: Llama, seq: int) -> int:
    """6 x non-embedding parameters (forward and backward matmuls) + 12 x layers x hidden x sequence (attention)."""
    dense = sum(p.numel() for p in model.parameters()) - model.embed.weight.numel()
    return 6 * dense + 12 * len(model.layers) * model.embed.embedding_dim * seq


def peak_tflops_of(name: str) -> float | None:
    """The dense bf16 peak of the GPU named ``name`` (torch.cuda.get_device_name), by its most specific key."""
    found = [key for key in PEAK_BF16_TFLOPS if key in name]
    return PEAK_BF16_TFLOPS[max(found, key=len)] if found else None


def peak_flops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override * 1e12
    if device.type != "cuda":
        return None
    tflops = peak_tflops_of(torch.cuda.get_device_name(device))
    return tflops * 1e12 if tflops is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a few-million-parameter config (CPU check)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (CPU check without a compiler)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per process and step")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s of one device")
    args = parser.parse_args()
    if args.tiny:
        config = {"vocab": 512, "dim": 128, "layers": 2, "heads": 4, "ffn": 344, "seq": 64}
        batch, steps = args.batch or 2, args.steps or 3
    else:  # ~1.1B parameters: Llama-style, 2048 wide, 16 layers, 32k vocabulary
        config = {"vocab": 32000, "dim": 2048, "layers": 16, "heads": 16, "ffn": 5632, "seq": 2048}
        batch, steps = args.batch or 4, args.steps or 10

    from torch.distributed.fsdp import MixedPrecisionPolicy

    from accel import Accelerator
    from accel.utils import FullyShardedDataParallelPlugin
    from accel_fsdp.policies import reshard_after_forward

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, mixed_precision_policy=policy, transformer_cls_names_to_wrap=["LlamaBlock"]
    )
    accelerator = Accelerator(fsdp_plugin=plugin, dynamo_backend=None if args.no_compile else "inductor")
    device, world = accelerator.device, accelerator.num_processes
    meta_model = build(config, torch.device("meta"))
    params = sum(p.numel() for p in meta_model.parameters())
    model_flops_per_token = flops_per_token(meta_model, config["seq"])

    acc_model = build(config, device)
    acc_opt = torch.optim.AdamW(acc_model.parameters(), lr=1e-4, fused=device.type == "cuda")
    acc_model, acc_opt = accelerator.prepare(acc_model, acc_opt)
    raw_model = raw_prepare(
        build(config, device), compile_blocks=not args.no_compile, reshard_after_forward=reshard_after_forward(plugin)
    )
    settings = {"accel": fsdp_settings(accelerator.unwrap_model(acc_model)), "raw": fsdp_settings(raw_model)}
    raw_opt = torch.optim.AdamW(raw_model.parameters(), lr=1e-4, fused=device.type == "cuda")

    generator = torch.Generator(device="cpu").manual_seed(accelerator.process_index)
    tokens = torch.randint(0, config["vocab"], (batch, config["seq"] + 1), generator=generator).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def loss_of(model) -> torch.Tensor:
        return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())

    def raw_step() -> None:
        loss_of(raw_model).backward()
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), 1.0)
        raw_opt.step()
        raw_opt.zero_grad()

    def accel_step() -> None:
        accelerator.backward(loss_of(acc_model))
        accelerator.clip_grad_norm_(acc_model.parameters(), 1.0)
        acc_opt.step()
        acc_opt.zero_grad()

    peak_mib: dict[str, float] = {}  # per variant, the most GPU memory allocated during its timed steps

    def timed(name: str) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            variants[name]()
        if device.type == "cuda":
            torch.cuda.synchronize()
            peak_mib[name] = max(peak_mib.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**20)
        return (time.perf_counter() - start) / steps

    variants = {"raw": raw_step, "accel": accel_step}
    for step in variants.values():  # warm-up: compilation, allocator
        step(), step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in list(variants) if r % 2 == 0 else list(reversed(variants)):
            times[name].append(timed(name))
    peak = peak_flops(device, args.peak_tflops)
    results = {}
    for name, values in times.items():
        step_s = statistics.median(values)
        tokens_per_s = batch * config["seq"] * world / step_s
        mfu = model_flops_per_token * tokens_per_s / (world * peak) if peak else None
        results[name] = {
            "variant": name,
            "params": params,
            "flops_per_token": model_flops_per_token,
            **settings[name],
            "processes": world,
            "device": str(device.type),
            "step_s": step_s,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu,
            "peak_mib": peak_mib.get(name),  # the other variant's sharded weights and optimizer state included
            "compile": not args.no_compile,
            "steps": steps,
            "rounds": args.rounds,
        }
    if accelerator.is_main_process:
        for result in results.values():
            print(json.dumps(result))
        ratio = results["accel"]["step_s"] / results["raw"]["step_s"]
        mfu = results["accel"]["mfu"]
        print(
            f"{params / 1e6:.1f}M parameters, {world} processes: step accel / raw = {ratio:.3f}"
            + (
                f"; MFU accel {mfu:.1%}, raw {results['raw']['mfu']:.1%}"
                if mfu is not None
                else "; MFU n/a (no known peak: pass --peak-tflops)"
            )
            + (
                f"; peak memory accel {peak_mib['accel'] / 1024:.1f} GiB, raw {peak_mib['raw'] / 1024:.1f} GiB"
                if peak_mib
                else ""
            )
        )
        assert math.isfinite(ratio)
        assert settings["accel"] == settings["raw"], f"not like for like: {settings}"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
