"""Whether the installed torch and torch-xla can run together, read from package metadata only. No torch here.

torch-xla is built against one torch release and its wheel does not declare it, so a mismatched pair installs fine
and fails deep inside the first XLA operation. accel-xla's ``xla`` extra pins the pair it is tested with
(``torch==2.9.0`` next to ``torch-xla==2.9.0``); ``accel launch`` (``accel_xla.cli``) and the workers
(``accel_xla.runtime``) refuse another pair with the versions to install.

Example::

    from accel_xla.versions import check_installed_pair

    check_installed_pair()  # ImportError naming the fix when torch and torch-xla are different releases
"""

from __future__ import annotations

from importlib import metadata

from accel_core.install_hints import accel_extra

DISTRIBUTION = "accel-xla"
EXTRA = "xla"
PAIR = ("torch", "torch-xla")


def installed_version(name: str) -> str | None:
    """The installed version of the distribution ``name``, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def pinned_pair() -> dict[str, str]:
    """The torch and torch-xla specifiers of accel-xla's ``xla`` extra, e.g. ``{"torch": "==2.9.0", ...}`` (read
    from the installed metadata, so the message follows the pin; empty when accel-xla is not installed)."""
    # Only when a pair is refused: parsing requirements costs `accel launch` a few hundred milliseconds.
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    pair: dict[str, str] = {}
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        in_extra = requirement.marker is not None and requirement.marker.evaluate({"extra": EXTRA})
        if in_extra and requirement.name in PAIR:
            pair[requirement.name] = str(requirement.specifier)
    return pair


def install_command() -> str:
    """``pip install torch==2.9.0 torch-xla==2.9.0``: the pair accel-xla's ``xla`` extra installs."""
    pair = pinned_pair()
    if set(pair) != set(PAIR):
        return 'pip install "accel-xla[xla]"'
    return "pip install " + " ".join(f"{name}{pair[name]}" for name in PAIR)


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"2.9.0+cu128"``."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"Cannot read a release from the version {version!r}.") from None


def check_versions(torch_version: str, torch_xla_version: str) -> None:
    """Raises ImportError naming the fix unless torch and torch-xla are the same release (2.9.x with 2.9.y)."""
    if release(torch_version) != release(torch_xla_version):
        major, minor = release(torch_xla_version)
        raise ImportError(
            f"torch-xla {torch_xla_version} runs only with torch {major}.{minor}, but torch {torch_version} is "
            f"installed: {install_command()} (the pair `{accel_extra('xla')}` installs), or "
            f"pip install torch=={major}.{minor}.* to keep this torch-xla."
        )


def check_installed_pair() -> None:
    """``check_versions`` on the installed distributions; nothing to check without torch-xla (the strategy says
    how to install it when it starts) or without torch."""
    torch_version, torch_xla_version = installed_version("torch"), installed_version("torch-xla")
    if torch_version is not None and torch_xla_version is not None:
        check_versions(torch_version, torch_xla_version)
