"""``accel estimate-memory MODEL``: per-process bytes of a model's training state, per dtype and strategy.

The model is built on torch's meta device (no memory, no weights read) from a local Python file or
module (``path/to/models.py:build`` or ``package.module:Model``: a class or a function called with no
arguments) or a local Hugging Face config (a folder holding ``config.json``, or the file; needs
``transformers``). The arithmetic is in ``accel.commands.memory_model``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .memory_model import (
    DTYPE_BYTES,
    OPTIMIZERS,
    QUANTIZED_BITS,
    STRATEGIES,
    TP_STRATEGIES,
    ParameterShape,
    RankBytes,
    estimate,
    estimate_quantized,
)

if TYPE_CHECKING:
    from torch import nn

DESCRIPTION = """Estimates the bytes each process holds for a model's parameters, gradients and
optimizer state, per parameter dtype and strategy (the largest process: rank 0). Activations,
buffers and temporary all-gathers are not counted.

MODEL is a Python file or module and the name of a class or function in it that builds the model
with no arguments (models.py:build_model, mypackage.models:Net), or a local Hugging Face config
(a folder with config.json; needs transformers). It is built on the meta device: nothing is
allocated and no weights are read.

Strategies: ddp (every process holds everything), fsdp (FSDP2: each process a 1/N slice of every
parameter along its first dimension), zero1 / zero2 / zero3 (DeepSpeed: optimizer state /
+ gradients / + parameters partitioned, with DeepSpeed's fp32 master copy). --tp-sizes adds
tensor parallelism (from the model's tp_plan) with ddp and fsdp over the other processes.
With --mixed-precision bf16 the parameters stay float32: read the float32 rows. int8 / int4 (as
Accelerate's --dtypes takes them) are quantized weights that do not train: their rows count the
parameters alone (no gradients, no optimizer state; an adapter trained on top is not counted)."""

EPILOG = """examples:
  accel estimate-memory models.py:build_model -n 8
  accel estimate-memory ./llama-config/ -n 8 --dtypes bfloat16 --tp-sizes 2 --tp-sizes 4
  accel estimate-memory mypackage.models:Net -n 2 --strategies ddp fsdp --json"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel estimate-memory",
        usage="accel estimate-memory MODEL [-n N] [--dtypes DTYPE ...] [--strategies NAME ...] [--tp-sizes TP] "
        "[--optimizer NAME] [--library_name NAME] [--json]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="file.py:name, package.module:name, or a config.json folder")
    parser.add_argument(
        "-n",
        "--num-processes",
        "--num_processes",
        dest="num_processes",
        type=int,
        action="append",
        metavar="N",
        help="processes in the job (default 8; repeat for a table each: -n 2 -n 8)",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=[*DTYPE_BYTES, *QUANTIZED_BITS],
        default=["float32", "bfloat16"],
        help="parameter dtypes (default: float32 bfloat16; int8 / int4: quantized weights, not trained)",
    )
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES), help="default: all")
    parser.add_argument(
        "--tp-sizes",
        "--tp_sizes",
        dest="tp_sizes",
        type=int,
        action="append",
        default=[],
        metavar="TP",
        help="a tensor-parallel size to add (repeatable), with ddp and fsdp over the other processes (needs the "
        "model's tp_plan)",
    )
    parser.add_argument("--optimizer", choices=list(OPTIMIZERS), default="adamw", help="default: adamw")
    parser.add_argument(
        "--library-name",
        "--library_name",
        dest="library_name",
        choices=["transformers", "timm"],
        help="what builds MODEL, as Accelerate's flag says: transformers (MODEL: a local config.json or its folder; "
        "the default for one) or timm (MODEL: a timm architecture name such as resnet50, built without weights)",
    )
    parser.add_argument("--json", action="store_true", help="print the byte counts as JSON, one object per row")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.num_processes = args.num_processes or [8]
    if any(n < 1 for n in args.num_processes):
        raise ValueError("--num-processes takes counts of at least 1.")
    model = build_on_meta(args.model, args.library_name)
    parameters = parameter_shapes(model, need_plan=bool(args.tp_sizes))
    optimizer = OPTIMIZERS[args.optimizer]
    rows = []
    for processes in args.num_processes:
        for dtype in args.dtypes:
            layouts = [(strategy, 1) for strategy in args.strategies]
            layouts += [(s, tp) for tp in args.tp_sizes for s in args.strategies if s in TP_STRATEGIES]
            for strategy, tp in layouts:
                if tp > processes or processes % tp:
                    continue
                if dtype in QUANTIZED_BITS:
                    counted = estimate_quantized(parameters, strategy, processes, QUANTIZED_BITS[dtype], tp)
                else:
                    counted = estimate(parameters, strategy, processes, DTYPE_BYTES[dtype], optimizer, tp)
                rows.append(
                    {"processes": processes, "dtype": dtype, "strategy": strategy, "tp_size": tp, **_as_dict(counted)}
                )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    total = sum(p.numel for p in parameters)
    trainable = sum(p.numel for p in parameters if p.trainable)
    print(
        f"model: {type(model).__name__} from {args.model}: {total:,} parameters ({trainable:,} trainable) in "
        f"{len(parameters)} tensors; optimizer {optimizer.name}"
    )
    print("bytes held by the largest process (rank 0); activations and temporary buffers not counted")
    _print_tables(rows)
    return 0


def _as_dict(counted: RankBytes) -> dict[str, int]:
    return {
        "parameters": counted.parameters,
        "gradients": counted.gradients,
        "optimizer_state": counted.optimizer_state,
        "total": counted.total,
    }


def _print_tables(rows: list[dict[str, Any]]) -> None:
    header = f"  {'strategy':<14}{'parameters':>14}{'gradients':>14}{'optimizer':>14}{'total':>14}"
    current = None
    for row in rows:
        if (row["processes"], row["dtype"]) != current:
            current = (row["processes"], row["dtype"])
            frozen = (
                " (quantized: not trained, no gradients or optimizer state)" if row["dtype"] in QUANTIZED_BITS else ""
            )
            print(f"\n{row['processes']} processes, parameters in {row['dtype']}{frozen}\n{header}")
        name = row["strategy"] if row["tp_size"] == 1 else f"tp{row['tp_size']} + {row['strategy']}"
        sizes = "".join(f"{_human(row[key]):>14}" for key in ("parameters", "gradients", "optimizer_state", "total"))
        print(f"  {name:<14}{sizes}")


def _human(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def build_on_meta(spec: str, library_name: str | None = None) -> nn.Module:
    """The model ``spec`` names, built on the meta device (``library_name``: ``timm`` reads ``spec`` as a timm
    architecture name; ``transformers`` requires a local Hugging Face config)."""
    import torch
    from torch import nn

    if library_name == "timm":
        factory = _timm_factory(spec)
    elif library_name == "transformers":
        path = Path(spec).expanduser()
        if not (path.is_dir() or path.name == "config.json"):
            raise ValueError(
                f"--library_name transformers reads a local Hugging Face config: {spec!r} is not a folder holding "
                "config.json (models are not downloaded from the Hub; save the config with "
                "AutoConfig.from_pretrained(name).save_pretrained(folder) where the Hub is reachable)."
            )
        factory = _hf_factory(path)
    else:
        factory = _factory(spec)
    with torch.device("meta"):
        model = factory()
    if not isinstance(model, nn.Module):
        raise ValueError(f"{spec} built a {type(model).__name__}, not a torch.nn.Module: name what builds the model.")
    return model


def _factory(spec: str) -> Any:
    """What builds the model: a class or function from ``file.py:name`` / ``module:name``, or a HF config."""
    path = Path(spec).expanduser()
    if path.is_dir() or path.name == "config.json":
        return _hf_factory(path)
    source, _, name = spec.rpartition(":")
    if not source or not name:
        raise ValueError(
            f"MODEL {spec!r}: name the builder after a colon (models.py:build_model, mypackage.models:Net), or pass "
            "a folder holding a Hugging Face config.json."
        )
    file = Path(source).expanduser()
    if source.endswith(".py") or file.is_file():
        if not file.is_file():
            raise ValueError(f"MODEL {spec!r}: {file} does not exist.")
        sys.path.insert(0, str(file.resolve().parent))  # its sibling modules import as when it runs as a script
        module_spec = importlib.util.spec_from_file_location(file.stem, file)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"MODEL {spec!r}: {file} is not a Python file.")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError as error:
            raise ValueError(f"MODEL {spec!r}: cannot import {source} ({error}).") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"MODEL {spec!r}: {source} has no class or function named {name!r}.")
    return factory


def _timm_factory(name: str) -> Any:
    try:
        import timm  # pyright: ignore[reportMissingImports]  # optional, not installed in the workspace
    except ImportError:
        raise ImportError(
            f"--library_name timm builds {name!r} with timm, which is not installed: pip install timm."
        ) from None
    if name not in timm.list_models():
        close = timm.list_models(f"*{name}*")[:5]
        hint = f" Close names: {', '.join(close)}." if close else ""
        raise ValueError(f"timm has no architecture named {name!r}.{hint}")
    return lambda: timm.create_model(name, pretrained=False)  # the architecture only: nothing is downloaded


def _hf_factory(path: Path) -> Any:
    try:
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
    except ImportError:
        raise ImportError(
            f"{path} is a Hugging Face config: reading it needs transformers (pip install transformers)."
        ) from None
    config = AutoConfig.from_pretrained(str(path.parent if path.name == "config.json" else path))

    def build() -> Any:
        try:
            return AutoModelForCausalLM.from_config(config)
        except ValueError:  # not a causal LM: the bare model
            return AutoModel.from_config(config)

    return build


def parameter_shapes(model: nn.Module, need_plan: bool = False) -> list[ParameterShape]:
    """Each distinct parameter (tied ones once) with the dimension the model's ``tp_plan`` splits."""
    split = _tp_split_dims(model)
    if need_plan and not split:
        hint = ""
        if type(model).__module__.startswith("transformers."):  # their public tp_plan arrived in 4.56
            hint = ' Hugging Face models have one from transformers 4.56: pip install -U "transformers>=4.56".'
        raise ValueError(
            f"--tp-sizes needs to know how {type(model).__name__} is split: give the model a tp_plan attribute "
            "(module-name patterns to 'colwise' / 'rowwise', as ParallelismConfig(tp_plan=...) takes)." + hint
        )
    return [
        ParameterShape(name, tuple(param.shape), param.requires_grad, split.get(name))
        for name, param in model.named_parameters()
    ]


def _tp_split_dims(model: nn.Module) -> dict[str, int]:
    """Parameter name -> the dimension its tp_plan style splits (torch's ColwiseParallel / RowwiseParallel)."""
    from torch import nn

    from accel_core.transforms.tensor_parallel import matching_modules

    plan = getattr(model, "tp_plan", None)  # what accel's tensor-parallel transform reads without a config plan
    if not isinstance(plan, dict):
        return {}
    dims: dict[str, int] = {}
    for key, style in plan.items():
        kind = (style if isinstance(style, str) else type(style).__name__).lower()
        column = "colwise" in kind
        if not column and "rowwise" not in kind:
            continue  # sequence parallel and the like replicate the parameters
        for name, module in matching_modules(model, key):
            prefix = f"{name}." if name else ""
            if isinstance(module, nn.Linear):
                dims[prefix + "weight"] = 0 if column else 1
                if column and module.bias is not None:
                    dims[prefix + "bias"] = 0
            elif isinstance(module, nn.Embedding):
                dims[prefix + "weight"] = 1 if column else 0
    return dims
