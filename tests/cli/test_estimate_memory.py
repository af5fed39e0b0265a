"""`accel estimate-memory`: the arithmetic on small real models (tensor-parallel plans, uneven FSDP2 chunks,
ZeRO partitions) and its user errors. The comparison with bytes measured on 2 processes (DDP, FSDP2) is in
tests/fsdp/test_fsdp_multiprocess.py, next to the launch that measures them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from accel.cli import main
from accel.commands.estimate_memory import build_on_meta, parameter_shapes
from accel.commands.memory_model import OPTIMIZERS, estimate

MODELS = '''
from typing import ClassVar
from torch import nn


class Tiny(nn.Module):
    """Rows 3 and 5: over 2 processes FSDP2 gives rank 0 two rows and three rows."""

    tp_plan: ClassVar[dict[str, str]] = {"up": "colwise", "down": "rowwise"}

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 6)
        self.down = nn.Linear(6, 4)
        self.odd = nn.Linear(5, 3)
        self.table = nn.Embedding(5, 2)
        self.table.weight.requires_grad_(False)


def build() -> nn.Module:
    return Tiny()
'''


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    code = main(["estimate-memory", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_bytes_per_strategy_follow_torchs_layouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    rows = run_json(capsys, f"{tmp_path / 'models.py'}:build", "-n", "2", "--dtypes", "float32", "--tp-sizes", "2")
    by_layout = {(r["strategy"], r["tp_size"]): r for r in rows}
    # Each parameter's elements: up 24 + 6, down 24 + 4, odd 15 + 3, table 10 (frozen); 6 tensors trained.
    everything, trained = 24 + 6 + 24 + 4 + 15 + 3 + 10, 24 + 6 + 24 + 4 + 15 + 3
    ddp = by_layout["ddp", 1]
    assert (ddp["parameters"], ddp["gradients"]) == (4 * everything, 4 * trained)
    assert ddp["optimizer_state"] == 2 * 4 * trained + 4 * 6  # exp_avg + exp_avg_sq, one float32 step per tensor
    # FSDP2: rank 0 holds ceil(rows / 2) rows of each: up 3x4 + 3, down 2x6 + 2, odd 2x5 + 2, table 3x2.
    fsdp_trained = 12 + 3 + 12 + 2 + 10 + 2
    fsdp = by_layout["fsdp", 1]
    assert (fsdp["parameters"], fsdp["gradients"]) == (4 * (fsdp_trained + 6), 4 * fsdp_trained)
    assert fsdp["optimizer_state"] == 2 * 4 * fsdp_trained + 4 * 6
    # ZeRO: flat partitions of ceil(count / 2), fp32 master copy + two fp32 Adam states.
    assert by_layout["zero1", 1]["optimizer_state"] == 12 * (trained // 2)
    assert by_layout["zero2", 1]["gradients"] == 4 * (trained // 2)
    assert by_layout["zero3", 1]["parameters"] == 4 * (everything // 2)
    # TP 2 (no data parallelism left): the plan splits up's rows (weight and bias) and down's columns.
    tp = by_layout["ddp", 2]
    assert tp["parameters"] == 4 * (12 + 3 + 12 + 4 + 15 + 3 + 10)
    assert ("zero3", 2) not in by_layout  # DeepSpeed does not take accel's tensor parallelism


def test_the_counts_match_the_model_torch_builds(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    model = build_on_meta(f"{tmp_path / 'models.py'}:Tiny")
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing was allocated
    shapes = parameter_shapes(model)
    real = {name: p for name, p in nn.Linear(5, 3).named_parameters()}
    assert [s.shape for s in shapes if s.name.startswith("odd.")] == [tuple(p.shape) for p in real.values()]
    held = estimate(shapes, "ddp", 1, torch.tensor([], dtype=torch.bfloat16).element_size(), OPTIMIZERS["sgd"])
    assert held.parameters == 2 * sum(s.numel for s in shapes) and held.optimizer_state == 0


def test_user_errors_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plain.py").write_text("from torch import nn\n\ndef build():\n    return nn.Linear(3, 3)\n")
    cases = [
        (["nowhere"], "name the builder after a colon"),
        ([f"{tmp_path / 'missing.py'}:build"], "does not exist"),
        ([f"{tmp_path / 'plain.py'}:nothing"], "has no class or function named 'nothing'"),
        ([f"{tmp_path / 'plain.py'}:build", "--tp-sizes", "2"], "give the model a tp_plan attribute"),
        (["no_such_package.models:Net"], "cannot import no_such_package.models"),
    ]
    for argv, expected in cases:
        assert main(["estimate-memory", *argv]) == 2, argv
        assert expected in capsys.readouterr().err, argv


def test_the_table_names_the_model_and_each_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    # Options before MODEL work too (-n takes one count, repeated for several tables).
    assert main(["estimate-memory", "-n", "2", "-n", "4", "--tp-sizes", "2", f"{tmp_path / 'models.py'}:build"]) == 0
    out = capsys.readouterr().out
    assert "model: Tiny from" in out and "86 parameters (76 trainable)" in out
    for title in ("2 processes, parameters in float32", "4 processes, parameters in bfloat16"):
        assert title in out
    assert "tp2 + fsdp" in out and "zero3" in out


@pytest.mark.slow  # imports transformers
def test_a_hugging_face_config_folder_with_its_own_tp_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import LlamaConfig

    LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        tie_word_embeddings=True,
    ).save_pretrained(tmp_path)
    model = build_on_meta(str(tmp_path))
    assert type(model).__name__ == "LlamaForCausalLM"
    shapes = {s.name: s for s in parameter_shapes(model, need_plan=True)}
    assert "lm_head.weight" not in shapes  # tied to the embedding: counted once
    assert shapes["model.layers.0.self_attn.q_proj.weight"].tp_dim == 0  # colwise in transformers' plan
    assert shapes["model.layers.0.self_attn.o_proj.weight"].tp_dim == 1  # rowwise
    rows = run_json(capsys, str(tmp_path), "-n", "2", "--dtypes", "float32", "--strategies", "ddp", "--tp-sizes", "2")
    by_tp = {r["tp_size"]: r for r in rows}
    assert by_tp[1]["parameters"] == 4 * sum(p.numel() for p in model.parameters())
    split = sum(s.numel for s in shapes.values() if s.tp_dim is not None)
    assert by_tp[2]["parameters"] == by_tp[1]["parameters"] - 4 * split // 2


def test_a_model_without_a_tp_plan_is_refused_with_the_fix() -> None:
    plain = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="give the model a tp_plan attribute") as refused:
        parameter_shapes(plain, need_plan=True)
    assert "transformers" not in str(refused.value)
    # A Hugging Face model from before transformers 4.56 has no public tp_plan: the message says which release does.
    older = type("LlamaForCausalLM", (nn.Module,), {"__module__": "transformers.models.llama.modeling_llama"})()
    older.proj = nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r'pip install -U "transformers>=4.56"'):
        parameter_shapes(older, need_plan=True)
