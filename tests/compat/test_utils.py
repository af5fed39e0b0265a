"""accel.utils names from the reference: on 2 real processes (utils_script.py) and in one process."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accel.utils as utils

UTILS_CHECKS = [
    "tqdm_main_only", "tqdm_everywhere", "extract_model_from_parallel_unwraps_ddp", "save_main_process_only",
    "load_back", "gather_object_concatenates_lists", "send_to_device_keywords", "convert_to_fp32_keyword",
    "slice_tensors_keywords", "synchronize_rng_states_continues_with_process_0s",
    "find_executable_batch_size_shrinks_each_process_batch", "release_memory_returns_nones",
]  # fmt: skip


@pytest.mark.parametrize("name", UTILS_CHECKS)
def test_utils_on_two_processes(two_process_run, name) -> None:
    """scripts/api_checks.py's accel.utils section."""
    two_process_run.run.assert_passed(name)


# -- find_executable_batch_size -------------------------------------------------------------------
@pytest.fixture
def frozen_heap():
    """find_executable_batch_size runs gc.collect() before each try (as the reference does): in a pytest process
    holding the whole suite's objects each collection took ~0.3 s (4 s for the test below in the full suite).
    gc.freeze() leaves what existed before the test out of those collections; what the tries allocate is still
    collected, and the collections still run."""
    gc.freeze()
    yield
    gc.unfreeze()


def _allocate_above(limit: int):
    tried: list[int] = []

    def train(batch_size: int, scale: float = 1.0) -> tuple[int, float]:
        tried.append(batch_size)
        if batch_size > limit:
            torch.empty(2**62, dtype=torch.uint8)  # a real allocation failure of the CPU allocator
        return batch_size, scale

    return train, tried


def test_batch_shrinks_by_the_reference_factor_on_a_cpu_allocation_failure(frozen_heap: None) -> None:
    train, tried = _allocate_above(30)
    assert utils.find_executable_batch_size(train, starting_batch_size=64)(scale=2.0) == (28, 2.0)
    assert tried == [64, 57, 51, 45, 40, 36, 32, 28]  # int(size * 0.9) each time, as the reference
    # Decorator form with a custom reduction; a later call starts from the last size found.
    train, tried = _allocate_above(10)
    halves = iter([32, 16, 8])
    decorated = utils.find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda: next(halves))(
        train
    )
    assert decorated() == (8, 1.0) and tried == [64, 32, 16, 8]
    assert decorated() == (8, 1.0) and tried[-1] == 8


def test_batch_size_errors(frozen_heap: None) -> None:
    train, _ = _allocate_above(0)
    with pytest.raises(RuntimeError, match=r"No executable batch size found, reached zero\."):
        utils.find_executable_batch_size(train, starting_batch_size=4)()
    with pytest.raises(TypeError, match="Batch size was passed into `train` as the first argument"):
        utils.find_executable_batch_size(_allocate_above(8)[0], starting_batch_size=4)(4, 2.0)

    def fails(batch_size: int) -> None:
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        utils.find_executable_batch_size(fails)()


def test_out_of_memory_errors_of_every_device_are_recognised() -> None:
    from accel_core.compat.memory import should_reduce_batch_size

    assert should_reduce_batch_size(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert should_reduce_batch_size(RuntimeError("XPU out of memory. Tried to allocate 1 GiB"))
    assert should_reduce_batch_size(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear"))
    assert should_reduce_batch_size(RuntimeError("FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed"))
    assert not should_reduce_batch_size(RuntimeError("shape mismatch")) and not should_reduce_batch_size(
        ValueError("x")
    )


# -- availability checks --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("check", "module"),
    [
        ("is_wandb_available", "wandb"), ("is_tensorboard_available", "tensorboard"),
        ("is_mlflow_available", "mlflow"), ("is_comet_ml_available", "comet_ml"),
        ("is_deepspeed_available", "deepspeed"), ("is_datasets_available", "datasets"),
        ("is_transformers_available", "transformers"), ("is_peft_available", "peft"), ("is_rich_available", None),
        ("is_aim_available", "aim"), ("is_clearml_available", "clearml"), ("is_dvclive_available", "dvclive"),
        ("is_schedulefree_available", "schedulefree"), ("is_torchao_available", "torchao"),
        ("is_pytest_available", "pytest"),
        ("is_transformer_engine_available", "transformer_engine"), ("is_torchvision_available", "torchvision"),
    ],
)  # fmt: skip
def test_package_checks_answer_what_is_installed_without_importing_it(check: str, module: str | None) -> None:
    code = (
        f"import sys; from accel.utils import {check}; "
        f"print({check}(), {module!r} in sys.modules, 'torch' in sys.modules)"
    )
    answer, imported, torch_imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    expected = module is not None and importlib.util.find_spec(module) is not None
    assert answer == str(expected) and imported == "False" and torch_imported == "False"


def test_device_checks_on_this_machine() -> None:
    environ = dict(os.environ)
    assert utils.is_cuda_available() == torch.cuda.is_available()
    # Asked without starting torch's CUDA state, and the process's environment is as it was.
    assert not torch.cuda.is_initialized() and dict(os.environ) == environ
    for check in ("is_npu_available", "is_mlu_available", "is_musa_available", "is_sdaa_available", "is_hpu_available",
                  "is_neuron_available", "is_torch_xla_available"):  # fmt: skip
        assert getattr(utils, check)() is False  # none of these is installed here
    assert utils.is_bf16_available() is True and utils.is_fp16_available() is True
    assert utils.is_torch_version(">=", "2.4") and not utils.is_torch_version("<", "2.0")
    assert utils.compare_versions("torch", ">=", "2.4")
    with pytest.raises(ValueError, match="`operation` must be one of"):
        utils.compare_versions("torch", "=>", "2.4")


# -- enums ----------------------------------------------------------------------------------------
def test_enums_have_the_reference_members() -> None:
    from accel import DistributedType

    for member in ("MULTI_NPU", "MULTI_MLU", "MULTI_HPU", "MULTI_MUSA", "MULTI_SDAA", "MULTI_NEURON", "XLA"):
        assert getattr(DistributedType, member) == member
    assert DistributedType.MULTI_CPU != DistributedType.MULTI_NPU
    assert "fp16" in utils.PrecisionType and "fp4" not in utils.PrecisionType
    assert utils.DynamoBackend("INDUCTOR") is utils.DynamoBackend.INDUCTOR and "INDUCTOR" in utils.DynamoBackend
    assert utils.RNGType.NPU == "npu" and utils.LoggerType.TRACKIO == "trackio"


# -- environment ----------------------------------------------------------------------------------
def test_patch_and_clear_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TEST_KEEP", "old")
    monkeypatch.delenv("ACCEL_TEST_NEW", raising=False)
    with utils.patch_environment(accel_test_keep="new", accel_test_new=3):
        assert os.environ["ACCEL_TEST_KEEP"] == "new" and os.environ["ACCEL_TEST_NEW"] == "3"
    assert os.environ["ACCEL_TEST_KEEP"] == "old" and "ACCEL_TEST_NEW" not in os.environ
    with utils.clear_environment():
        assert dict(os.environ) == {}
        os.environ["ONLY_INSIDE"] = "1"
    assert "ONLY_INSIDE" not in os.environ and os.environ["ACCEL_TEST_KEEP"] == "old"
    assert utils.str_to_bool("Yes") == 1 and utils.str_to_bool("off", to_bool=True) is False
    with pytest.raises(ValueError, match="invalid truth value"):
        utils.str_to_bool("maybe")

    @utils.purge_accelerate_environment
    def sets_variables() -> None:
        os.environ["ACCELERATE_MIXED_PRECISION"] = "fp16"

    sets_variables()
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ


def test_write_basic_config(tmp_path: Path) -> None:
    from accel_launch.config import read_config

    path = tmp_path / "config.yaml"
    assert utils.write_basic_config(mixed_precision="BF16", save_location=str(path)) == path
    config = read_config(path)
    assert config["mixed_precision"] == "bf16" and config["num_processes"] >= 1
    assert utils.write_basic_config(save_location=str(path)) is False  # an existing file is kept
    with pytest.raises(ValueError, match="`mixed_precision` should be one of"):
        utils.write_basic_config(mixed_precision="fp4", save_location=str(tmp_path / "other.yaml"))


# -- models, tensors, files -----------------------------------------------------------------------
def test_extract_model_from_parallel_keeps_or_drops_compile() -> None:
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(torch.nn.DataParallel(model))
    assert utils.is_compiled_module(compiled)
    assert utils.extract_model_from_parallel(compiled, keep_torch_compile=False) is model
    kept = utils.extract_model_from_parallel(compiled)
    assert utils.is_compiled_module(kept) and kept._orig_mod is model


@pytest.mark.slow
def test_backend_wrappers_unwrap_once_their_library_is_imported() -> None:
    """accel-deepspeed and accel-megatron register their wrappers (accel.model_wrappers); unwrapping
    imports neither library, and finds DeepSpeed's engine once DeepSpeed is imported."""
    code = (
        "import sys\n"
        "from accel_core import model_utils, discovery\n"
        "assert {'deepspeed', 'megatron.core'} <= set(discovery.available(model_utils.WRAPPERS))\n"
        "assert len(model_utils._wrapper_types()) == 3 and 'deepspeed' not in sys.modules\n"
        "import deepspeed\n"
        "assert deepspeed.DeepSpeedEngine in model_utils._wrapper_types()\n"
        "print('UNWRAP OK')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "UNWRAP OK" in done.stdout, done.stderr[-2000:]


def test_structure_helpers() -> None:
    data = {"a": torch.ones(2, 3, dtype=torch.bfloat16), "b": [torch.zeros(2)]}
    info = utils.get_data_structure(data)
    assert isinstance(info["a"], utils.TensorInformation) and info["a"].shape == (2, 3)
    assert utils.initialize_tensors(info)["a"].dtype == torch.bfloat16
    assert utils.listify(data) == {"a": [[1.0] * 3] * 2, "b": [[0.0, 0.0]]}
    assert utils.find_device(data) == torch.device("cpu") and utils.ignorant_find_batch_size(data) == 2
    assert utils.ignorant_find_batch_size({"x": 3}) is None
    forward = utils.convert_outputs_to_fp32(lambda: torch.ones(1, dtype=torch.float16))
    assert forward().dtype == torch.float32
    assert utils.gather_object(["a"]) == ["a"] and utils.gather_object({"k": 1}) == {"k": 1}  # one process: unchanged


def test_save_and_load(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4, bias=False))
    model[1].weight = model[0].weight  # tied: safetensors cannot store both names
    with pytest.warns(UserWarning, match="Removed shared tensor"):
        utils.save(model.state_dict(), tmp_path / utils.SAFE_WEIGHTS_NAME, safe_serialization=True)
    assert list(load_file(tmp_path / "model.safetensors")) == ["0.weight"]
    utils.save({"step": 3, "array": __import__("numpy").arange(3)}, tmp_path / utils.WEIGHTS_NAME)
    loaded = utils.load(tmp_path / "pytorch_model.bin")
    assert loaded["step"] == 3 and list(loaded["array"]) == [0, 1, 2]
    torch.save({"f": os.getcwd}, tmp_path / "code.bin")  # unpickling it would import a function
    with pytest.raises(Exception, match="Weights only load failed"):
        utils.load(tmp_path / "code.bin")


def test_reference_constants() -> None:
    assert (utils.SAFE_WEIGHTS_NAME, utils.WEIGHTS_NAME) == ("model.safetensors", "pytorch_model.bin")
    assert utils.SAFE_WEIGHTS_INDEX_NAME == "model.safetensors.index.json"
    assert utils.WEIGHTS_INDEX_NAME == "pytorch_model.bin.index.json"
    assert (utils.OPTIMIZER_NAME, utils.SCHEDULER_NAME, utils.SCALER_NAME, utils.RNG_STATE_NAME) == (
        "optimizer", "scheduler", "scaler.pt", "random_states")  # fmt: skip
    assert "MULTI_CPU" in utils.TORCH_DISTRIBUTED_OPERATION_TYPES


def test_merge_fsdp_weights(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    state_dict = {"layer.weight": torch.randn(3, 3), "steps": torch.arange(4)}
    sharded = tmp_path / "pytorch_model_fsdp_0"
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state_dict, checkpoint_id=str(sharded))  # what a sharded FSDP save writes, here from one process
    utils.merge_fsdp_weights(str(sharded), str(tmp_path / "merged"))
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert merged.keys() == state_dict.keys() and all(torch.equal(merged[k], v) for k, v in state_dict.items())
    utils.merge_fsdp_weights(str(sharded), str(tmp_path / "bin"), safe_serialization=False, remove_checkpoint_dir=True)
    assert torch.load(tmp_path / "bin" / "pytorch_model.bin").keys() == state_dict.keys() and not sharded.exists()
    with pytest.raises(ValueError, match="couldn't find a valid metadata file"):
        utils.merge_fsdp_weights(str(sharded), str(tmp_path / "again"))
