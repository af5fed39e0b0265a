"""The fp8 recipe kwargs handlers: plain settings that choose and configure the fp8 backend.

They live in core so that ``Accelerator(kwargs_handlers=[...])`` can index them and scripts can
import them from ``accel.utils``; the backend package (accel-fp8) reads them. Nothing here imports
torchao or Transformer-Engine: a torchao ``Float8LinearConfig`` is built by accel-fp8 when
``AORecipeKwargs.config`` is left None. Fields the constructor is not given hold the reference's defaults; the
Accelerator then gives them the run's ``ACCEL_FP8_<FIELD>`` (``apply_environment`` with its settled record, from
accel-fp8's factory: the reference reads ``ACCELERATE_FP8_<FIELD>`` from ``os.environ`` in the constructor). Nothing
here reads ``os.environ``.

Which backend runs: the recipe handler given (``AORecipeKwargs`` -> torchao, ``TERecipeKwargs`` ->
Transformer-Engine), else ``ACCEL_FP8_BACKEND`` (``AO`` or ``TE``), else torchao when installed,
else Transformer-Engine (``fp8_backend_of``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, cast

from .. import environment as env
from ..compat.availability import is_torchao_available, is_transformer_engine_available
from ..configuration import KwargsHandler
from ..enums import FP8BackendType
from ..install_hints import accel_extra

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_COMPUTE_ALGORITHMS = ("max", "most_recent")
# torchao's named recipes (``Float8LinearConfig.from_recipe_name``).
AO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
_PREFIX = "ACCEL_FP8_"


def _flag(name: str, default: bool, environ: Mapping[str, str]) -> bool:
    return env.flag(_PREFIX + name, default, environ)


class _SettledFromEnvironment:
    """A recipe handler whose fields the constructor was not given come from the run's ``ACCEL_FP8_*``.

    The constructor fills them with the defaults (``_fill`` with no variables) and remembers which were given;
    ``apply_environment`` fills the others again from the run's settled variables. A field given always wins."""

    _given: frozenset[str] = frozenset()

    def _field_names(self) -> list[str]:
        return [f.name for f in fields(cast("DataclassInstance", self))]  # every recipe handler is a dataclass

    def _remember_given(self) -> None:
        self._given = frozenset(name for name in self._field_names() if getattr(self, name) is not None)

    def apply_environment(self, environ: Mapping[str, str]) -> None:
        """Gives the fields the constructor was not given their ``ACCEL_FP8_<FIELD>`` value in ``environ`` (the run's
        ``RunSettings.environ``), else the default; idempotent. accel-fp8 calls it when it builds the precision."""
        for name in self._field_names():
            if name not in self._given:
                setattr(self, name, None)
        self._fill(environ)

    def _fill(self, environ: Mapping[str, str]) -> None:
        raise NotImplementedError


@dataclass
class AORecipeKwargs(_SettledFromEnvironment, KwargsHandler):
    """fp8 training with torchao's ``Float8Linear`` (runs on CPU too, and on GPUs of compute capability >= 8.9).

    config: a ``torchao.float8.Float8LinearConfig``; None builds one from ``recipe_name`` (or torchao's
        default tensorwise recipe) with ``pad_inner_dim`` and ``enable_fsdp_float8_all_gather``.
    module_filter_func: ``fn(module, fqn) -> bool``, which ``nn.Linear`` layers to convert. Default (as
        Accelerate): every linear layer whose dimensions divide by 16, except the model's first and last
        linear layers, which stay in high precision for stability.
    pad_inner_dim: pad inner dimensions to multiples of 16 for ``torch._scaled_mm`` (default True).
    enable_fsdp_float8_all_gather: FSDP2 gathers the weights in float8 (half the bytes of bf16; tensorwise
        recipe only; default True, turned off for the rowwise recipes, which torchao refuses it for).
    recipe_name: accel addition: one of ``AO_RECIPES`` (``ACCEL_FP8_RECIPE``); default tensorwise.

    Example::

        from accel import Accelerator
        from accel.utils import AORecipeKwargs

        accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(recipe_name="rowwise")])
    """

    config: Any = None
    module_filter_func: Callable[..., bool] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None
    recipe_name: str | None = None

    def __post_init__(self) -> None:
        if not is_torchao_available():
            raise ImportError(f"AORecipeKwargs needs torchao: {accel_extra('fp8')} (or pip install accel-fp8).")
        self._remember_given()
        self._fill({})

    def _fill(self, environ: Mapping[str, str]) -> None:
        if self.config is None:
            if self.recipe_name is None:
                self.recipe_name = environ.get(_PREFIX + "RECIPE") or None
            if self.recipe_name is not None and self.recipe_name not in AO_RECIPES:
                raise ValueError(f"recipe_name must be one of {list(AO_RECIPES)}, got {self.recipe_name!r}.")
            if self.pad_inner_dim is None:
                self.pad_inner_dim = _flag("PAD_INNER_DIM", True, environ)
            if self.enable_fsdp_float8_all_gather is None:
                # torchao gathers float8 weights only with tensorwise scales.
                default = self.recipe_name in (None, "tensorwise")
                self.enable_fsdp_float8_all_gather = _flag("ENABLE_FSDP_FLOAT8_ALL_GATHER", default, environ)


@dataclass
class TERecipeKwargs(_SettledFromEnvironment, KwargsHandler):
    """fp8 training with Transformer-Engine (CUDA, compute capability >= 8.9): its ``DelayedScaling`` recipe.

    use_autocast_during_eval: keep ``fp8_autocast`` on in eval mode (default False: metrics are usually better).
    margin / interval: the scaling factor's margin, and how many steps between recomputations.
    fp8_format: ``HYBRID`` (E4M3 forward, E5M2 backward), ``E4M3`` or ``E5M2``.
    amax_history_len / amax_compute_algo: the amax history and how a scale is computed from it
        (``max`` or ``most_recent``).
    override_linear_precision: run the (fprop, dgrad, wgrad) GEMMs in higher precision.
    use_mxfp8_block_scaling: Transformer-Engine's ``MXFP8BlockScaling`` recipe instead (Blackwell).

    Example::

        from accel.utils import TERecipeKwargs

        accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(fp8_format="HYBRID")])
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        if not is_transformer_engine_available():
            raise ImportError(
                'TERecipeKwargs needs Transformer-Engine: pip install "accel-fp8[te]" (a CUDA machine with its '
                "toolkit), or use AORecipeKwargs (torchao)."
            )
        self._remember_given()
        self._fill({})

    def _fill(self, environ: Mapping[str, str]) -> None:
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = _flag("USE_AUTOCAST_DURING_EVAL", False, environ)
        if self.margin is None:
            self.margin = env.get_int(_PREFIX + "MARGIN", 0, environ)
        if self.interval is None:
            self.interval = env.get_int(_PREFIX + "INTERVAL", 1, environ)
        self.fp8_format = (self.fp8_format or environ.get(_PREFIX + "FORMAT") or "HYBRID").upper()
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"`fp8_format` must be one of {' or '.join(FP8_FORMATS)}, got {self.fp8_format!r}.")
        self.amax_compute_algo = (
            self.amax_compute_algo or environ.get(_PREFIX + "AMAX_COMPUTE_ALGO") or "most_recent"
        ).lower()
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGORITHMS:
            raise ValueError(
                f"`amax_compute_algo` must be one of {' or '.join(AMAX_COMPUTE_ALGORITHMS)}, "
                f"got {self.amax_compute_algo!r}."
            )
        if self.amax_history_len is None:
            self.amax_history_len = env.get_int(_PREFIX + "AMAX_HISTORY_LEN", 1024, environ)
        if self.override_linear_precision is None:
            self.override_linear_precision = (
                _flag("OVERRIDE_FPROP", False, environ),
                _flag("OVERRIDE_DGRAD", False, environ),
                _flag("OVERRIDE_WGRAD", False, environ),
            )
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = _flag("USE_MXFP8_BLOCK_SCALING", False, environ)

    def to_kwargs(self) -> dict[str, Any]:
        """Every field (the defaults and the run's ``ACCEL_FP8_*`` included), as the recipe is built from them."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass
class FP8RecipeKwargs(TERecipeKwargs):
    """Deprecated (as in Accelerate): use ``TERecipeKwargs`` or ``AORecipeKwargs``.

    backend: ``"TE"`` (Transformer-Engine) or ``"AO"`` (torchao, accel addition; ``"MSAMP"`` is not
        supported by accel). The TE fields are read when the backend is TE.
    """

    backend: str | None = None
    opt_level: str | None = None  # MS-AMP's; kept so reference scripts construct, refused with backend="MSAMP"

    def __post_init__(self) -> None:
        warnings.warn(
            "FP8RecipeKwargs is deprecated (as in Accelerate): use TERecipeKwargs or AORecipeKwargs instead.",
            FutureWarning,
            stacklevel=3,
        )
        self._remember_given()
        self._fill({})

    def _fill(self, environ: Mapping[str, str]) -> None:
        backend = (self.backend or environ.get(_PREFIX + "BACKEND") or "TE").upper()
        if backend == "MSAMP":
            raise ValueError(
                "accel does not support MS-AMP: use backend='TE' (Transformer-Engine) or AORecipeKwargs (torchao)."
            )
        if backend not in ("TE", "AO"):
            raise ValueError(f"`backend` must be 'TE' or 'AO' to use FP8RecipeKwargs, got {self.backend!r}.")
        self.backend = backend
        # The TE fields get their defaults either way; TE itself is only needed when it runs.
        super()._fill(environ)


RECIPE_HANDLERS: tuple[type[KwargsHandler], ...] = (AORecipeKwargs, TERecipeKwargs, FP8RecipeKwargs)


def fp8_recipe_handler(handlers: Mapping[type, Any]) -> KwargsHandler | None:
    """The one fp8 recipe handler among ``handlers`` (None when none was given); two is a ValueError."""
    given = [handlers[kind] for kind in RECIPE_HANDLERS if kind in handlers]
    if len(given) > 1:
        raise ValueError(
            f"Pass one fp8 recipe handler, got {', '.join(type(h).__name__ for h in given)}: each chooses a backend."
        )
    return given[0] if given else None


def fp8_backend_of(handlers: Mapping[type, Any], environ: Mapping[str, str]) -> FP8BackendType:
    """The fp8 backend a run uses (see the module docstring); ``NO`` when nothing can run fp8.

    environ: the run's settled variables (``RunSettings.environ``), where ``ACCEL_FP8_BACKEND`` is read."""
    handler = fp8_recipe_handler(handlers)
    if isinstance(handler, FP8RecipeKwargs):
        return FP8BackendType(handler.backend)
    if isinstance(handler, AORecipeKwargs):
        return FP8BackendType.AO
    if isinstance(handler, TERecipeKwargs):
        return FP8BackendType.TE
    chosen = (environ.get(_PREFIX + "BACKEND") or "").upper()
    if chosen:
        if chosen not in ("AO", "TE"):
            raise ValueError(f"{_PREFIX}BACKEND={chosen!r}: use AO (torchao) or TE (Transformer-Engine).")
        return FP8BackendType(chosen)
    if is_torchao_available():
        return FP8BackendType.AO
    if is_transformer_engine_available():
        return FP8BackendType.TE
    return FP8BackendType.NO
