"""The code the READMEs and the documentation show works when a user copies it.

- Every ``python`` block parses, each name it imports exists, each call of an imported name uses keywords the
  callee takes, and each ``accelerator.<name>`` it uses exists (a renamed argument, method or class fails here, not
  in a user's first run).
- Every block that is a whole script (it uses no name it does not define: no ``model`` or ``loader`` left to the
  reader) runs as written, in an empty folder: one process, or under torchrun where its first line says so; here,
  or in the test named in ``RUN_ELSEWHERE``.
- Every ``accel launch`` line the pages show in full (the options and a script) is accepted by ``accel launch
  --dry-run``, which resolves and checks the options without starting anything.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [REPO / "README.md", *REPO.glob("packages/*/README.md"), *REPO.glob("docs/**/*.md")],
    key=lambda page: str(page.relative_to(REPO)),
)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```$", re.M | re.S)
INLINE_LAUNCH = re.compile(r"`((?:uv run )?accel launch [^`]*?\.py)`")
TORCHRUN_LINE = re.compile(r"^# .*run with: torchrun --nproc_per_node (\d+) ")
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    index: int  # the page's n-th python block
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}"


def _python_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        found = PYTHON_BLOCK.findall(page.read_text())
        blocks += [Block(str(page.relative_to(REPO)), n, code) for n, code in enumerate(found, 1)]
    # A snippet include (--8<-- "file") shows a file that its own tests run.
    return [block for block in blocks if not block.code.startswith("--8<--")]


BLOCKS = _python_blocks()


def _imported(tree: ast.Module) -> dict[str, object]:
    """The names a block binds with ``from module import name``, resolved here (an ImportError fails the test)."""
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                found = getattr(module, alias.name, None)
                if found is None:  # a submodule: `from torch.utils import data`
                    found = importlib.import_module(f"{node.module}.{alias.name}")
                names[alias.asname or alias.name] = found
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
    return names


def _read(node: ast.AST) -> set[str]:
    """The names an expression reads, less those its comprehensions and lambdas bind themselves."""
    inner: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.comprehension):
            inner |= {name.id for name in ast.walk(sub.target) if isinstance(name, ast.Name)}
        elif isinstance(sub, ast.Lambda):
            inner |= {arg.arg for arg in ast.walk(sub.args) if isinstance(arg, ast.arg)}
    loads = {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)}
    return loads - inner


def _stored(node: ast.AST) -> set[str]:
    return {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)}


def _undefined(tree: ast.Module) -> set[str]:
    """Names the block reads before it binds them (in the order it runs), other than builtins: what it leaves to
    the reader (``model``, ``loader``, ``MyModel``...). Function and class bodies are read against everything the
    block binds, as they run later."""
    bound, missing, deferred = set(dir(builtins)), set(), []

    def run(statements: list[ast.stmt]) -> None:
        nonlocal missing
        for statement in statements:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                deferred.append(statement)
                bound.add(statement.name)
            elif isinstance(statement, (ast.Import, ast.ImportFrom)):
                bound.update((alias.asname or alias.name).split(".")[0] for alias in statement.names)
            elif isinstance(statement, (ast.For, ast.AsyncFor)):
                missing |= _read(statement.iter) - bound
                bound.update(_stored(statement.target))
                run(statement.body + statement.orelse)
            elif isinstance(statement, (ast.With, ast.AsyncWith)):
                for item in statement.items:
                    missing |= _read(item.context_expr) - bound
                    if item.optional_vars is not None:
                        bound.update(_stored(item.optional_vars))
                run(statement.body)
            elif isinstance(statement, (ast.If, ast.While)):
                missing |= _read(statement.test) - bound
                run(statement.body + statement.orelse)
            else:  # an assignment reads its value before it binds its targets
                missing |= _read(statement) - bound
                bound.update(_stored(statement))

    run(tree.body)
    for definition in deferred:
        args = {arg.arg for arg in ast.walk(definition) if isinstance(arg, ast.arg)}
        missing |= _read(definition) - bound - args - _stored(definition)
    return missing


@pytest.mark.slow  # imports every backend (DeepSpeed, Megatron-core, torchao...) into this process
def test_each_block_parses_imports_what_exists_and_calls_with_accepted_keywords() -> None:
    problems = []
    for block in BLOCKS:
        try:
            tree = ast.parse(block.code)
            names = _imported(tree)
        except (SyntaxError, ImportError, AttributeError) as error:
            problems.append(f"{block.id}: {type(error).__name__}: {error}")
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names):
                continue
            try:
                signature = inspect.signature(names[node.func.id])  # type: ignore[arg-type]
            except (TypeError, ValueError):  # a builtin without a signature
                continue
            keywords = {keyword.arg: None for keyword in node.keywords if keyword.arg}
            try:
                signature.bind_partial(*[None] * len(node.args), **keywords)
            except TypeError as error:
                problems.append(f"{block.id}: `{ast.unparse(node)[:120]}`: {error}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # makes an Accelerator in this process
def test_each_accelerator_attribute_a_block_uses_exists() -> None:
    from accel import Accelerator
    from accel.state import AcceleratorState

    accelerator = Accelerator(cpu=True)
    try:
        problems = [
            f"{block.id}: accelerator.{node.attr}"
            for block in BLOCKS
            for node in ast.walk(ast.parse(block.code))
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "accelerator"
            and not hasattr(accelerator, node.attr)
        ]
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert not problems, "\n".join(problems)


WHOLE_SCRIPTS = [block for block in BLOCKS if not _undefined(ast.parse(block.code))]
# Whole scripts another test runs already, as a user would: the wheels' tests run each distribution's README example
# in the clean environment its install line builds; the meta package's example is the train.py that accel-launch's
# example launches on two processes (below).
RUN_ELSEWHERE = {
    "packages/accel-core/README.md#1": "tests/packaging/test_wheels.py",
    "packages/accel-data/README.md#1": "tests/packaging/test_wheels.py",
    "packages/accel-deepspeed/README.md#1": "tests/packaging/test_wheels.py",
    "packages/accel-fp8/README.md#1": "tests/packaging/test_wheels.py",
    "packages/accel/README.md#1": "packages/accel-launch/README.md#1, as its train.py",
}


def test_the_whole_scripts_are_found_and_each_is_run() -> None:
    found = {block.id for block in WHOLE_SCRIPTS}
    # Whole scripts today; one that starts leaving a name to the reader drops out of the runs, which this notices.
    assert found >= {*RUN_ELSEWHERE, "packages/accel-launch/README.md#1", "docs/backends/ddp.md#1"}, found
    assert "packages/accel-checkpoint/README.md#1" not in found  # uses `model`, `loader`... it does not define


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "block", [block for block in WHOLE_SCRIPTS if block.id not in RUN_ELSEWHERE], ids=lambda block: block.id
)
def test_each_whole_script_runs_as_written(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "shown.py"
    script.write_text(block.code)
    # A block that launches `train.py` (accel-launch's) finds the script the meta package's README shows.
    (tmp_path / "train.py").write_text(next(b for b in BLOCKS if b.id == "packages/accel/README.md#1").code)
    torchrun = TORCHRUN_LINE.match(block.code)
    command = [sys.executable, str(script)]
    if torchrun:
        command = [str(BIN / "torchrun"), "--nproc_per_node", torchrun.group(1), str(script)]
    ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, f"{block.id}:\n{block.code}\n{ran.stdout[-3000:]}\n{ran.stderr[-5000:]}"


def _launch_lines() -> list[tuple[str, str]]:
    lines = []
    for page in PAGES:
        text = page.read_text()
        for block in SHELL_BLOCK.findall(text):
            for line in block.replace("\\\n", " ").splitlines():
                command = line.split("#", 1)[0].split("&&")[-1].strip().rstrip("&").strip()
                if " accel launch " in f" {command}" and ".py" in command:
                    lines.append((str(page.relative_to(REPO)), command))
        for inline in INLINE_LAUNCH.findall(text):
            if "[" not in inline:  # `accel launch [options] script.py`: a usage pattern, not a command
                lines.append((str(page.relative_to(REPO)), " ".join(inline.split())))
    return sorted(set(lines))


LAUNCH_LINES = _launch_lines()


def test_the_launch_lines_are_found() -> None:
    assert ("README.md", "uv run accel launch --cpu -n 2 examples/train_digits.py") in LAUNCH_LINES
    assert any(page == "docs/checkpointing.md" and "--machine-rank 1" in line for page, line in LAUNCH_LINES)
    assert len(LAUNCH_LINES) >= 12, LAUNCH_LINES


@pytest.mark.slow
@pytest.mark.parametrize(("page", "line"), LAUNCH_LINES, ids=[f"{page}:{line}" for page, line in LAUNCH_LINES])
def test_each_launch_line_shown_is_accepted(page: str, line: str, tmp_path: Path) -> None:
    words = shlex.split(line)
    environment = {}
    while "=" in words[0]:  # PJRT_DEVICE=TPU accel launch ...
        name, value = words.pop(0).split("=", 1)
        environment[name] = value
    if words[:2] == ["uv", "run"]:
        words = words[2:]
    if words[0] == "srun":  # srun [options] accel launch ...: a task of a SLURM job runs the launch line
        words = words[words.index("accel") :]
    assert words[:2] == ["accel", "launch"], line
    script = next(word for word in words if word.endswith(".py"))
    (tmp_path / script).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / script).write_text("print('never run')\n")
    env = {**os.environ, **environment}
    ran = subprocess.run(
        [str(BIN / "accel"), "launch", "--dry-run", *words[2:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0 and "command:" in ran.stdout, f"{page}: `{line}`:\n{ran.stdout}\n{ran.stderr}"
