"""The checkpoint's format version is read: what this version cannot read is refused, naming both versions.

Before, a checkpoint whose ``format_version`` was 999, 0 or missing, whose ``format`` was another tool's, or which a
newer accel-checkpoint wrote, loaded without a word.
"""

from __future__ import annotations

import json
import logging
from importlib import metadata as importlib_metadata
from pathlib import Path

import pytest
import torch

from accel_checkpoint import CheckpointFormatError, CheckpointMismatchError
from accel_checkpoint.constants import FORMAT_VERSION, METADATA_NAME
from accel_core import Accelerator

INSTALLED = importlib_metadata.version("accel-checkpoint")


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Accelerator, torch.nn.Module, Path]:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    folder = Path(accelerator.save_state(str(tmp_path / "ckpt")))
    return accelerator, model, folder


def _edit(folder: Path, **changes: object) -> None:
    path = folder / METADATA_NAME
    metadata = json.loads(path.read_text())
    for key, value in changes.items():
        if value is _DROP:
            metadata.pop(key)
        else:
            metadata[key] = value
    path.write_text(json.dumps(metadata))


_DROP = object()


def test_the_written_version_loads_without_a_warning(saved, caplog: pytest.LogCaptureFixture) -> None:
    accelerator, _model, folder = saved
    assert json.loads((folder / METADATA_NAME).read_text())["format_version"] == FORMAT_VERSION == 1
    with caplog.at_level(logging.WARNING):
        accelerator.load_state(str(folder))
    assert not [r for r in caplog.records if "newer" in r.getMessage()]


def test_a_newer_format_version_is_refused_naming_both_versions(saved) -> None:
    accelerator, _model, folder = saved
    _edit(folder, format_version=999, versions={"accel-checkpoint": "9.0.0"})
    with pytest.raises(CheckpointFormatError) as caught:
        accelerator.load_state(str(folder))
    message = str(caught.value)
    print(message)
    assert message == (
        f"{folder / METADATA_NAME} was written in format version 999 by accel-checkpoint 9.0.0, newer than this "
        f"accel-checkpoint ({INSTALLED}) reads accel-checkpoint format version 1. Upgrade accel (pip install -U accel) "
        "to load it."
    )
    assert isinstance(caught.value, CheckpointMismatchError)  # what code catching mismatches already catches


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"format_version": 0}, "has format version 0 by accel-checkpoint"),
        ({"format_version": _DROP}, "has no valid format_version (None)"),
        ({"format_version": "1"}, "has no valid format_version ('1')"),
        ({"format": "orbax"}, "is not accel-checkpoint metadata: its format is 'orbax', not 'accel-checkpoint'"),
        ({"format": _DROP}, "is not accel-checkpoint metadata: its format is None"),
    ],
)
def test_a_version_or_format_no_accel_checkpoint_wrote_is_refused(saved, change: dict, says: str) -> None:
    accelerator, model, folder = saved
    with torch.no_grad():
        model.weight.add_(1.0)
    before = model.weight.detach().clone()
    _edit(folder, **change)
    with pytest.raises(CheckpointFormatError) as caught:
        accelerator.load_state(str(folder))
    message = str(caught.value)
    print(message)
    assert message.startswith(f"{folder / METADATA_NAME} {says}"), message
    assert f"this accel-checkpoint ({INSTALLED}) reads accel-checkpoint format version 1" in message
    assert torch.equal(model.weight, before)  # nothing was restored


def test_a_newer_writer_of_the_same_format_loads_with_a_warning(saved, caplog: pytest.LogCaptureFixture) -> None:
    accelerator, model, folder = saved
    saved_weight = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    _edit(folder, versions={"accel-checkpoint": "99.1.0"})
    with caplog.at_level(logging.WARNING):
        accelerator.load_state(str(folder))
    assert torch.equal(model.weight, saved_weight)
    warned = [r.getMessage() for r in caplog.records if "newer than this one" in r.getMessage()]
    assert warned == [
        f"{folder / METADATA_NAME} was written by accel-checkpoint 99.1.0, newer than this one ({INSTALLED}); its "
        "format version 1 is one this version reads, so it loads, but anything the newer writer added is ignored. "
        "Upgrade accel to read it all."
    ]


def test_resume_auto_refuses_a_newer_format_too(tmp_path: Path) -> None:
    """The automatic choice (``load_state()`` of the project's newest checkpoint) reads the version as well."""
    from accel_core.configuration import ProjectConfiguration

    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    accelerator.prepare(torch.nn.Linear(4, 4))
    folder = Path(accelerator.save_state())
    _edit(folder, format_version=2)
    with pytest.raises(CheckpointFormatError, match=r"format version 2 by accel-checkpoint .*newer than this"):
        accelerator.load_state()
