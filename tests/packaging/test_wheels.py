"""Every distribution builds from a clone with the README's command, ships its LICENSE and py.typed, declares
what its README says it depends on, and installs with the README's commands into fresh virtual environments,
where it runs: accel-core alone trains a step, accel-data shards a loader over 2 processes and, with its
`[stateful]` extra, passes its own checks there (tests/data/isolated_checks.py), accel-launch starts a 2-process
job, `accel[deepspeed]` and `accel[fp8]` train a step. A broken package boundary or install instruction
fails here before users see it.

The commands are read from the READMEs and run as written (`uv pip install`, into the environment named by
VIRTUAL_ENV, as an activated one). UV_CONSTRAINT pins every third-party package to uv.lock's version, so uv
links them from its cache instead of downloading a newer torch."""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from importlib.metadata import version
from pathlib import Path

import pytest
from checklist import RESULTS_ENV
from checkrun import HARNESS, CheckRun, checks_in, launch, torchrun_command
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
# The opt-in `accelerate` shim is no workspace member (`uv build --all-packages` leaves it out): test_shim.py builds
# and installs it.
SHIM = "accelerate"
PACKAGES = sorted(p.name for p in (REPO / "packages").iterdir() if (p / "pyproject.toml").exists() and p.name != SHIM)
# DeepSpeed compiles its CPU shared-memory op (deepspeed_shm_comm) when it starts, whatever the optimizer, and
# the build embeds the environment's paths: the deepspeed environment lives at one path per (Python, torch,
# DeepSpeed) on the machine, whichever clone runs the test, with an extensions folder of its own (sharing the
# workspace's would rebuild the op each time the two alternate), so the op is compiled by the machine's first run
# only (minutes) and reused after, by a fresh clone in a new folder too (a path keyed by the checkout rebuilt it in
# every new clone: 164 s). Runs from several checkouts take turns on it (an OS lock, released if a run dies). uv
# gives the installed sources a new modification time at each install, which ninja would take for an edit: they
# are set back to a fixed one.
DEEPSPEED_VENV = (
    Path.home()
    / ".cache"
    / "accel-ci"
    / "packaging-venvs"
    / "py{}.{}-torch{}-deepspeed{}".format(*sys.version_info[:2], version("torch"), version("deepspeed"))
)

# The other environments: one fixed folder each, per checkout (a module-scoped OS lock keeps two runs of one checkout
# apart), made anew by each run. Every environment keeps its Python bytecode beside it, outside the environment
# (PYTHONPYCACHEPREFIX; see Venv), for the next run.
CHECKOUT_VENVS = (
    Path.home() / ".cache" / "accel-ci" / "packaging-venvs" / f"checkout-{zlib.crc32(str(REPO).encode()):08x}"
)


def _version_of(package: str) -> str:
    text = (REPO / "packages" / package / "pyproject.toml").read_text()
    match = re.search(r'^version = "([^"]+)"', text, re.M)
    assert match is not None
    return match.group(1)


def _readme(package: str | None) -> str:
    return (REPO / "README.md" if package is None else REPO / "packages" / package / "README.md").read_text()


def _section(text: str, heading: str) -> str:
    """The text under the Markdown heading ``heading`` (e.g. ``"## Install"``), up to the next heading of its level."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = text.find(f"\n{level} ", start)
    return text[start:] if end == -1 else text[start:end]


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def _install_lines(package: str | None) -> list[str]:
    """The `uv pip install` lines of a README's Install section (the root README: between its snippet markers)."""
    text = _readme(package)
    if package is None:
        text = text.split("<!-- --8<-- [start:install] -->")[1].split("<!-- --8<-- [end:install] -->")[0]
    else:
        text = _section(text, "## Install") if "\n## Install\n" in text else text
    lines = [line for block in _code_blocks(text, "bash") for line in block.splitlines()]
    return [line for line in lines if line.startswith("uv pip install ")]


def _documented(package: str | None, needle: str) -> str:
    matches = [line for line in _install_lines(package) if needle in line]
    assert len(matches) == 1, f"{package or 'README.md'}: one install line with {needle!r} expected, got {matches}"
    return matches[0]


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return HeaderParser().parsestr(archive.read(name).decode())


def _requirement_key(requirement: Requirement) -> str:
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{canonicalize_name(requirement.name)}{extras}"


def _declared(wheel: Path) -> dict[str, set[str]]:
    """Requires-Dist of ``wheel`` by extra ('' for the unconditional ones), names with their extras."""
    metadata = _metadata(wheel)
    declared: dict[str, set[str]] = {"": set()}
    for extra in metadata.get_all("Provides-Extra") or []:
        declared[canonicalize_name(extra)] = set()
    for text in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(text)
        marker = str(requirement.marker or "")
        extra = re.search(r"""extra == ['"]([^'"]+)['"]""", marker)
        declared[canonicalize_name(extra.group(1)) if extra else ""].add(_requirement_key(requirement))
    return declared


def _stated(package: str) -> dict[str, set[str]]:
    """What the README's "Requires ..." paragraph says: backticked names, each `[extra]` starting that extra's list."""
    paragraphs = [p for p in re.split(r"\n\s*\n", _readme(package)) if p.startswith("Requires ")]
    assert len(paragraphs) == 1, f"{package}'s README needs one paragraph starting 'Requires ' naming its dependencies"
    stated: dict[str, set[str]] = {"": set()}
    current = ""
    for token in re.findall(r"`([^`]+)`", paragraphs[0]):
        if token.startswith("["):
            current = canonicalize_name(token.strip("[]"))
            stated[current] = set()
        else:
            stated[current].add(_requirement_key(Requirement(token)))
    return stated


@pytest.fixture(scope="module")
def checkout_venvs() -> Iterator[None]:
    """Holds CHECKOUT_VENVS from the first environment on: another run of the same checkout waits."""
    CHECKOUT_VENVS.mkdir(parents=True, exist_ok=True)
    with open(CHECKOUT_VENVS / "in-use.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="module")
def clone(accel_dist, checkout_venvs) -> Path:
    """A folder holding `dist/`, built by the README's command from this checkout (the clone; conftest.py's
    ``accel_dist``, shared with test_shim.py)."""
    return accel_dist.parent


@pytest.fixture(scope="module")
def wheels(clone) -> dict[str, Path]:
    return {w.name.split("-")[0].replace("_", "-"): w for w in (clone / "dist").glob("*.whl")}


@pytest.fixture(scope="module")
def sdists(clone) -> dict[str, Path]:
    return {s.name.rsplit("-", 1)[0].replace("_", "-"): s for s in (clone / "dist").glob("*.tar.gz")}


# PYTHONDONTWRITEBYTECODE is left out too: the first process to import torch in an environment writes the bytecode
# of what it imports, and the next processes (and the next runs: Venv keeps it) read it instead of compiling torch
# again (a one-step accel script: 22 s of CPU without bytecode, 8.4 s with). UV_PYTHON / UV_SYSTEM_PYTHON (a run of
# the suite on another interpreter: UV_PYTHON=python3.13 uv run pytest) would make `uv pip install` write into that
# interpreter instead of the activated environment (seen: every wheel test failed, and pyenv's 3.13 held torch).
IGNORED_ENVIRONMENT = {
    "UV_LOCKED",
    "UV_FROZEN",
    "UV_COMPILE_BYTECODE",
    "UV_PROJECT_ENVIRONMENT",
    "UV_PYTHON",
    "UV_SYSTEM_PYTHON",
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
}


class Venv:
    """A fresh virtual environment that the README's install lines target, as an activated one.

    Its processes read and write their bytecode in ``bytecode`` beside ``path`` (PYTHONPYCACHEPREFIX), which outlives
    the environment: the first import of torch in a fresh environment compiled everything it imports (~3 CPU-s per
    process; the 2-process runs compiled it in 3 processes at once), each run again. A kept file is used only for a
    source of the same modification time and size, as in a __pycache__ folder: uv links the third-party files from
    its cache (their times stay), and unpacks the freshly built accel wheels with new times."""

    def __init__(self, path: Path, clone: Path, constraints: Path) -> None:
        subprocess.run(["uv", "venv", "-q", "--clear", "--python", sys.executable, str(path)], check=True)
        self.python = path / "bin" / "python"
        self.site_packages = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        self.clone = clone
        # Not the workspace's settings (.ci/run's UV_LOCKED, UV_COMPILE_BYTECODE: seconds of bytecode per venv).
        env = {k: v for k, v in os.environ.items() if k not in IGNORED_ENVIRONMENT}
        self.env = {**env, "VIRTUAL_ENV": str(path), "UV_CONSTRAINT": str(constraints)}
        self.env["PYTHONPYCACHEPREFIX"] = str(path.parent / "bytecode")
        self.env["PATH"] = f"{path / 'bin'}{os.pathsep}{os.environ['PATH']}"

    def install(self, line: str) -> None:
        result = subprocess.run(
            shlex.split(line, comments=True), cwd=self.clone, env=self.env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, f"{line}\n{result.stderr}"

    def run(self, args: list[str], timeout: float = 300) -> str:
        result = subprocess.run(
            [str(self.python), *args], cwd=self.clone, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"{args}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
        return result.stdout

    def installed(self) -> set[str]:
        out = subprocess.run(["uv", "pip", "list", "--format=freeze"], env=self.env, capture_output=True, text=True)
        return {canonicalize_name(line.split("==")[0]) for line in out.stdout.splitlines() if "==" in line}


# ---- checks of the files (one build, no installs) ------------------------------------------------------------


def test_each_distribution_ships_the_repository_license():
    # license-files packs the package folder's copy; a copy that drifted from the repository's would ship stale text.
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    for package in PACKAGES:
        copy = REPO / "packages" / package / "LICENSE"
        assert copy.exists() and copy.read_text() == license_text, f"{copy} must be a copy of the repository's LICENSE"


@pytest.mark.slow
def test_each_distribution_has_its_own_versioned_wheel_and_sdist(wheels, sdists):
    assert sorted(wheels) == PACKAGES and sorted(sdists) == PACKAGES
    for package, wheel in wheels.items():
        assert f"-{_version_of(package)}-" in wheel.name


@pytest.mark.slow
def test_each_wheel_and_sdist_ships_license_and_py_typed(wheels, sdists):
    license_text = (REPO / "LICENSE").read_text()
    for package, wheel in wheels.items():
        module = package.replace("-", "_")
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            # PEP 561: without the marker, type checkers ignore the annotations of an installed package.
            assert f"{module}/py.typed" in names, f"{wheel.name} lacks {module}/py.typed"
            licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
            assert len(licenses) == 1, f"{wheel.name} lacks its LICENSE"
            assert archive.read(licenses[0]).decode() == license_text
        assert _metadata(wheel)["License-Expression"] == "Apache-2.0"
    for sdist in sdists.values():
        with tarfile.open(sdist) as archive:
            member = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
            assert member is not None and member.read().decode() == license_text, f"{sdist.name} lacks its LICENSE"


@pytest.mark.slow
def test_each_wheel_names_its_authors_urls_and_classifiers(wheels):
    for package, wheel in wheels.items():
        metadata = _metadata(wheel)
        assert metadata["Author"] == "accel developers", wheel.name
        urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
        assert {"Homepage", "Repository", "Issues", "Changelog"} <= set(urls), f"{wheel.name}: {urls}"
        assert urls["Changelog"].endswith(f"/packages/{package}/CHANGELOG.md")
        classifiers = metadata.get_all("Classifier") or []
        assert "Typing :: Typed" in classifiers and any(c.startswith("Development Status") for c in classifiers)


@pytest.mark.slow
def test_meta_package_depends_on_compatible_ranges(wheels):
    requirements = [Requirement(r) for r in _metadata(wheels["accel"]).get_all("Requires-Dist") or []]
    names = {r.name for r in requirements if r.marker is None}
    assert names >= {"accel-core", "accel-data", "accel-checkpoint", "accel-tracking", "accel-launch"}
    for requirement in requirements:
        if requirement.name.startswith("accel-"):
            spec = str(requirement.specifier)
            assert re.search(r">=\d", spec) and re.search(r"<\d", spec), f"{requirement} needs a compatible range"


@pytest.mark.slow
@pytest.mark.parametrize("package", PACKAGES)
def test_readme_states_the_wheels_dependencies(wheels, package):
    # Requires-Dist of the built wheel, per extra (hatchling writes an extra's whole closure), against the README.
    assert _stated(package) == _declared(wheels[package]), f"{package}/README.md's 'Requires' paragraph vs its wheel"


def test_every_readme_install_line_pins_the_meta_package():
    # PyPI's `accel` is another project with higher versions: an unpinned or 0.1.* `accel` would install it.
    lines = [line for package in (None, *PACKAGES) for line in _install_lines(package)]
    assert len(lines) >= 12
    for line in lines:
        arguments = shlex.split(line, comments=True)[3:]
        assert arguments[:2] == ["--find-links", "dist"], f"{line!r}: the accel-* distributions come from the wheels"
        for requirement in map(Requirement, arguments[2:]):
            if requirement.name == "accel":
                assert str(requirement.specifier) == f"=={_version_of('accel')}", f"{line!r}: pin accel exactly"


# ---- installs into fresh environments, with the documented commands -----------------------------------------

CORE_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import accel_core
assert accel_core.__version__ == "{version}"
print("IMPORTED WITHOUT TORCH")
"""

BEFORE_STEP = "before = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]"
AFTER_STEP = """
after = list(accelerator.unwrap_model(model).parameters())
assert any(not torch.equal(a.detach().float(), b.float()) for a, b in zip(after, before)), "no parameter moved"
print("STEP", accelerator.distributed_type, type(model).__name__)
"""


def _with_step_check(example: str) -> str:
    """``example`` with its parameters copied before its first backward (or the loop holding it) and compared after
    it ends: the step it documents must have trained."""
    lines = example.splitlines()
    start = next(i for i, line in enumerate(lines) if "accelerator.backward(" in line)
    while lines[start].startswith(" "):
        start -= 1
    return "\n".join([*lines[:start], BEFORE_STEP, *lines[start:], AFTER_STEP])


@pytest.mark.slow
def test_accel_core_alone_trains_a_step_and_imports_without_torch(clone, constraints):
    venv = Venv(CHECKOUT_VENVS / "accel-core" / "venv", clone, constraints)
    venv.install(_documented("accel-core", "accel-core"))
    assert not {"accel-data", "accel-checkpoint", "accel-tracking", "accel"} & venv.installed()
    # accel-core's README: "`import accel_core` does not import torch"; its example is a step with core alone.
    assert "IMPORTED WITHOUT TORCH" in venv.run(["-c", CORE_WITHOUT_TORCH.format(version=_version_of("accel-core"))])
    example = _code_blocks(_section(_readme("accel-core"), "## Install"), "python")[0]
    assert "STEP NO Linear" in venv.run(["-c", _with_step_check(example)])


# accel-data's own checks, run in the environment its README's commands build (tests/data/isolated_checks.py).
ACCEL_DATA_CHECKS = REPO / "tests" / "data" / "isolated_checks.py"


@dataclass
class AccelDataEnvironment:
    """What the accel-data environment showed: what each README command installed, what its standalone example
    printed on 2 processes, and the checks' run (with the `[stateful]` extra added)."""

    installed: set[str]
    example_output: str
    installed_with_extra: set[str]
    checks: CheckRun


@pytest.fixture(scope="module")
def accel_data_environment(clone, constraints, tmp_path_factory) -> AccelDataEnvironment:
    """One environment for accel-data alone (one venv, torch's bytecode compiled once): the README's install line,
    its standalone example under torchrun, then its `[stateful]` line (torchdata) and the check script, 2 processes."""
    tmp_path = tmp_path_factory.mktemp("accel-data")
    venv = Venv(CHECKOUT_VENVS / "accel-data" / "venv", clone, constraints)
    venv.install(_documented("accel-data", "accel-data"))
    installed = venv.installed()
    # The README's standalone example asserts that the 2 epochs gathered over the processes hold every sample once.
    script = tmp_path / "train.py"
    example = _code_blocks(_section(_readme("accel-data"), "## Standalone use"), "python")[0]
    # One string per print: the workers run unbuffered, so each argument of a print is its own write, and the two
    # ranks' writes to the shared pipe interleave ("SHARDEDSHARDED 0 7 198").
    # The report goes before the example ends its process group (it asks the group for the rank), which the example
    # must do: a gloo group left to the interpreter's exit aborted one run in this test under plain torchrun.
    head, ends_group, tail = example.rpartition("dist.destroy_process_group()")
    assert ends_group, "accel-data's standalone example should end with dist.destroy_process_group()"
    script.write_text(head + 'print(f"SHARDED {dist.get_rank()} {len(loader)} {len(seen)}")\n' + ends_group + tail)
    output = venv.run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)], timeout=300)
    # The extra is documented in a sentence, not a code block: `uv pip install ... "accel-data[stateful]"`.
    stateful = re.findall(r"`(uv pip install [^`]*accel-data\[stateful\][^`]*)`", _readme("accel-data"))
    assert len(stateful) == 1, f"accel-data's README: one `uv pip install` of accel-data[stateful] expected: {stateful}"
    venv.install(stateful[0])
    # Only the harness (standard library alone) on the path besides the environment's own packages, and a working
    # directory outside the workspace: nothing of it is importable.
    results = tmp_path / "results"
    env = {**venv.env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HARNESS), RESULTS_ENV: str(results)}
    command = torchrun_command(ACCEL_DATA_CHECKS, python=str(venv.python))
    checks = CheckRun.read(ACCEL_DATA_CHECKS, 2, launch(command, env, timeout=300, cwd=tmp_path), results)
    return AccelDataEnvironment(installed, output, venv.installed(), checks)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accel_data_shards_a_loader_over_two_processes(accel_data_environment):
    assert "accel-core" in accel_data_environment.installed and "accel" not in accel_data_environment.installed
    # Each process reporting 7 steps (99 samples, 8 per process per step) shows the loader was sharded.
    for rank in (0, 1):
        assert f"SHARDED {rank} 7 198" in accel_data_environment.example_output, accel_data_environment.example_output


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accel_data_stateful_extra_adds_torchdata_alone(accel_data_environment):
    # The extra brings torchdata next to the pinned torch and nothing of the meta-package's other distributions.
    installed = accel_data_environment.installed_with_extra
    assert {"accel-core", "accel-data", "torch", "torchdata"} <= installed, installed
    assert not installed & {"accel", "accel-checkpoint", "accel-tracking"}, installed


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", checks_in(ACCEL_DATA_CHECKS))
def test_accel_data_alone_passes_its_checks_on_two_processes(accel_data_environment, name):
    accel_data_environment.checks.assert_passed(name)


TWO_RANKS = """
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"RANK {dist.get_rank()} OF {dist.get_world_size()}", flush=True)  # one write: the ranks share the pipe
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_accel_launch_alone_starts_two_processes(clone, constraints):
    # The launcher needs accel-core only: its README's example starts a 2-process gloo job, each worker through
    # `python -m accel_launch.runner`, in an environment without the meta-package or the other distributions.
    venv = Venv(CHECKOUT_VENVS / "accel-launch" / "venv", clone, constraints)
    venv.install(_documented("accel-launch", "accel-launch"))
    assert "accel-core" in venv.installed() and not {"accel", "accel-data", "accel-checkpoint"} & venv.installed()
    (clone / "train.py").write_text(TWO_RANKS)
    example = _code_blocks(_section(_readme("accel-launch"), "## Install"), "python")[0]
    out = venv.run(["-c", example + '\nprint("EXIT", exit_code)\n'], timeout=300)
    assert "RANK 0 OF 2" in out and "RANK 1 OF 2" in out and "EXIT 0" in out, out


@pytest.mark.slow
def test_accel_installs_with_the_readme_command(clone, constraints):
    venv = Venv(CHECKOUT_VENVS / "accel" / "venv", clone, constraints)
    venv.install(_documented(None, '"accel==0.1.0"'))
    code = (
        "import sys, accel, accel.utils\n"
        "from importlib.metadata import entry_points\n"
        "assert 'torch' not in sys.modules\n"
        "assert {'dataloader'} <= {e.name for e in entry_points(group='accel.preparers')}\n"
        "assert {'state'} <= {e.name for e in entry_points(group='accel.checkpoint')}\n"
        "assert {'local'} <= {e.name for e in entry_points(group='accel.trackers')}\n"
        # Accelerate's tqdm wrapper works on the base install (tqdm is accel-tracking's dependency).
        "from accel.utils import tqdm\n"
        "assert list(tqdm(range(3), disable=True)) == [0, 1, 2]\n"
        "print('installed accel', accel.__version__)\n"
    )
    assert f"installed accel {_version_of('accel')}" in venv.run(["-c", code])
    example = _code_blocks(_section(_readme("accel"), "## Install"), "python")[0]
    assert "STEP NO Linear" in venv.run(["-c", _with_step_check(example)])
    # What needs a backend package names it before anything starts: an Accelerate backend flag, fp8.
    refusals = (
        "import subprocess, sys\n"
        "for flags in (['--use_fsdp'], ['--mixed_precision', 'fp8']):\n"
        "    command = [sys.executable, '-m', 'accel', 'launch', '--dry-run', '--cpu', *flags, 'train.py']\n"
        "    result = subprocess.run(command, capture_output=True, text=True)\n"
        "    print('REFUSED', result.returncode, result.stderr.strip().splitlines()[-1])\n"
    )
    refused = venv.run(["-c", refusals]).splitlines()
    assert refused[0].startswith("REFUSED 2 ") and 'pip install "accel[fsdp]==' in refused[0], refused
    assert refused[1].startswith("REFUSED 2 ") and 'pip install "accel[fp8]==' in refused[1], refused


@pytest.mark.slow
def test_accel_deepspeed_trains_a_step(clone, constraints):
    DEEPSPEED_VENV.mkdir(parents=True, exist_ok=True)
    with open(DEEPSPEED_VENV / "in-use.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another checkout's run of this test finishes first
        venv = Venv(DEEPSPEED_VENV / "venv", clone, constraints)
        venv.env["TORCH_EXTENSIONS_DIR"] = str(DEEPSPEED_VENV / "torch_extensions")
        venv.install(_documented("accel-deepspeed", '"accel[deepspeed]==0.1.0"'))
        for source in (venv.site_packages / "deepspeed" / "ops" / "csrc").rglob("*"):
            os.utime(source, (0, 0))
        assert {"accel-deepspeed", "deepspeed"} <= venv.installed()
        # The README's smallest run: torch's AdamW (a client optimizer), so DeepSpeed compiles no optimizer op.
        example = _code_blocks(_section(_readme("accel-deepspeed"), "## Install"), "python")[0]
        assert "STEP DEEPSPEED DeepSpeedEngine" in venv.run(["-c", _with_step_check(example)], 900)


@pytest.mark.slow
def test_accel_fp8_trains_a_step(clone, constraints):
    venv = Venv(CHECKOUT_VENVS / "accel-fp8" / "venv", clone, constraints)
    venv.install(_documented("accel-fp8", '"accel[fp8]==0.1.0"'))
    assert {"accel-fp8", "torchao"} <= venv.installed()
    example = _code_blocks(_section(_readme("accel-fp8"), "## Install"), "python")[0]
    check = (
        "\nfrom torchao.float8.float8_linear import Float8Linear\n"
        "converted = [m for m in accelerator.unwrap_model(model).modules() if isinstance(m, Float8Linear)]\n"
        "assert len(converted) == 2, accelerator.precision.report  # the middle two; first and last stay\n"
    )
    assert "STEP" in venv.run(["-c", _with_step_check(example) + check])
