"""The pip commands accel's error messages name.

PyPI's ``accel`` is another project whose version numbers are higher than ours, so a bare
``pip install "accel[deepspeed]"`` would install that one: a hint through the meta-package pins
accel's own release (every accel distribution shares it). The ``accel-*`` distributions are ours
alone and are named without a pin.
"""

from __future__ import annotations


def accel_extra(extra: str) -> str:
    """``pip install "accel[<extra>]==<this release>"``: the meta-package with one extra, pinned to this accel."""
    from importlib.metadata import version  # the installed release; importing accel_core here would be circular

    return f'pip install "accel[{extra}]=={version("accel-core")}"'
