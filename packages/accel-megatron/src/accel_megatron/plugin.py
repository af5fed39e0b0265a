"""``MegatronLMPlugin``: the Megatron-core settings, as data, readable from ``ACCEL_MEGATRON_*``. No torch here.

``accel launch --use-megatron --megatron-tp-degree 2`` writes ``ACCEL_MEGATRON_TP_DEGREE=2``;
``MegatronLMPlugin.from_env()`` reads it back in the launched processes. Option names follow
Accelerate's ``megatron_lm_config`` keys without their ``megatron_lm_`` prefix.

This version does tensor parallelism (TP), pipeline parallelism (PP, Megatron-core's schedules: GPUs
only, see ``accel_megatron.pipeline``) and data parallelism (DP). Settings that ask for more (the
distributed optimizer, activation recomputation) are refused here, when the plugin is built, so every
process fails the same way.

Example::

    plugin = MegatronLMPlugin(tp_degree=2, gradient_clipping=1.0)
    plugin = MegatronLMPlugin.from_env()          # ACCEL_MEGATRON_* from `accel launch`
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from accel_core import environment as env
from accel_core.settings import settle_environment

_NOT_YET = "is not supported by this version of accel-megatron (tensor, pipeline and data parallelism only)"


def _positive_int(raw: str) -> int:
    value = int(raw.strip())
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {raw!r}")
    return value


def _nonnegative_float(raw: str) -> float:
    value = float(raw.strip())
    if value < 0:
        raise ValueError(f"expected a number >= 0, got {raw!r}")
    return value


# ACCEL_MEGATRON_<OPTION> -> (plugin field, parser)
ENV_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "tp_degree": ("tp_degree", _positive_int),
    "pp_degree": ("pp_degree", _positive_int),
    "vp_degree": ("vp_degree", _positive_int),
    "num_micro_batches": ("num_micro_batches", _positive_int),
    "sequence_parallelism": ("sequence_parallelism", env.parse_flag),
    "recompute_activations": ("recompute_activations", env.parse_flag),
    "use_distributed_optimizer": ("use_distributed_optimizer", env.parse_flag),
    "gradient_clipping": ("gradient_clipping", _nonnegative_float),
    "seed": ("seed", lambda raw: int(raw.strip())),
    "lr_decay_style": ("lr_decay_style", lambda raw: raw.strip()),
    "min_lr": ("min_lr", _nonnegative_float),
    "is_train_batch_min": ("is_train_batch_min", env.parse_flag),
    "seq_length": ("seq_length", _positive_int),
    "encoder_seq_length": ("encoder_seq_length", _positive_int),
    "decoder_seq_length": ("decoder_seq_length", _positive_int),
}


@dataclass
class MegatronLMPlugin:
    """Megatron-core settings for ``Accelerator(megatron_lm_plugin=...)``.

    Args:
        tp_degree: tensor-parallel size: each TP layer's weight is split over this many processes,
            which see the same batches. Must divide the number of processes; the rest is data parallel.
        pp_degree: pipeline stages: the model is cut into ``pp_degree x vp_degree`` stages run by
            Megatron-core's schedules through ``accelerator.forward_backward`` (GPUs only: megatron-core
            0.16 allocates its send / receive buffers on CUDA, see ``accel_megatron.pipeline.CUDA_CALLS``).
        vp_degree: model chunks per pipeline rank (Megatron's virtual pipeline stages); above 1 the
            interleaved 1F1B schedule runs. Needs ``pp_degree > 1``.
        num_micro_batches: micro-batches of one training step (each batch is split into that many along
            dimension 0) run by ``accelerator.forward_backward``: through the pipeline schedule with
            ``pp_degree > 1``, through Megatron's no-pipelining schedule (``forward_backward_no_pipelining``:
            forward and backward per micro-batch, gradients accumulated, averaged over data parallelism once)
            without. Same GPU-only note as ``pp_degree``.
        sequence_parallelism: Megatron's sequence parallelism (activations split along the sequence
            in non-TP regions); needs ``tp_degree > 1``. Layers built with
            ``strategy.model_parallel_config()`` get it; the gradients of parameters marked
            ``sequence_parallel`` are summed over the TP group after each synced backward.
        recompute_activations: not supported in this version (must be False).
        use_distributed_optimizer: not supported in this version (must be False).
        gradient_clipping: if set, the global gradient norm is clipped to it after every synced
            backward (Megatron clips inside its optimizer step; here the optimizer is yours).
        seed: seed of Megatron's RNG tracker: the ``model-parallel-rng`` stream (dropout inside TP
            regions) differs per TP rank, the default stream is yours (``torch.manual_seed``).
        lr_decay_style: the shape of the schedule a ``MegatronLMDummyScheduler`` becomes (linear,
            cosine, constant, inverse-square-root).
        min_lr: that schedule's final learning rate.
        is_train_batch_min: with several dataloaders prepared, the smallest batch size is the
            ``micro_batch_size`` (else the largest), as in Accelerate.
        seq_length: the sequence length scripts read: ``decoder_seq_length`` (else
            ``encoder_seq_length``) when given, as Accelerate sets it.
        encoder_seq_length: the encoder's sequence length (encoder-decoder models).
        decoder_seq_length: the decoder's sequence length.

    Set when a dataloader is prepared, as Accelerate computes them: ``micro_batch_size`` (the
    dataloader's batch size per process), ``data_parallel_size`` (processes / (tp_degree x pp_degree))
    and ``global_batch_size`` (``data_parallel_size x micro_batch_size x num_micro_batches``): the
    samples of one optimizer step, which scripts use for their step counts. ``free_memory()`` clears them
    (the strategy's ``teardown``): the next dataloaders prepared set them afresh.

    Example::

        Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    """

    tp_degree: int = 1
    pp_degree: int = 1
    vp_degree: int = 1
    num_micro_batches: int = 1
    sequence_parallelism: bool = False
    recompute_activations: bool = False
    use_distributed_optimizer: bool = False
    gradient_clipping: float | None = None
    seed: int = 1234
    lr_decay_style: str = "linear"
    min_lr: float = 0.0
    is_train_batch_min: bool = True
    seq_length: int | None = None
    encoder_seq_length: int | None = None
    decoder_seq_length: int | None = None
    # Set by set_training_args when a dataloader is prepared (not constructor arguments, as in the reference).
    micro_batch_size: int | None = field(default=None, init=False)
    data_parallel_size: int | None = field(default=None, init=False)
    global_batch_size: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        for name in ("tp_degree", "pp_degree", "vp_degree", "num_micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MegatronLMPlugin({name}={value!r}): expected an integer >= 1.")
        if self.pp_degree == 1 and self.vp_degree != 1:
            raise ValueError(
                f"MegatronLMPlugin(vp_degree={self.vp_degree}) needs pp_degree > 1: virtual stages are extra model "
                "chunks per pipeline rank."
            )
        if self.vp_degree > 1 and self.num_micro_batches % self.pp_degree:
            raise ValueError(
                f"MegatronLMPlugin(vp_degree={self.vp_degree}, num_micro_batches={self.num_micro_batches}): "
                f"Megatron's interleaved schedule needs num_micro_batches to be a multiple of pp_degree="
                f"{self.pp_degree}."
            )
        if self.use_distributed_optimizer:
            raise ValueError(
                f"MegatronLMPlugin(use_distributed_optimizer=True): Megatron's distributed optimizer {_NOT_YET}. Set "
                "it to False."
            )
        if self.recompute_activations:
            raise ValueError(
                f"MegatronLMPlugin(recompute_activations=True) {_NOT_YET}. Set it to False; recompute inside your "
                "model (torch.utils.checkpoint) if you need to."
            )
        if self.sequence_parallelism and self.tp_degree == 1:
            raise ValueError(
                "MegatronLMPlugin(sequence_parallelism=True) needs tp_degree > 1: it splits activations over the TP "
                "group."
            )
        # The decoder's length, else the encoder's, is the sequence length (Accelerate's GPT / BERT parsers).
        self.seq_length = self.decoder_seq_length or self.encoder_seq_length or self.seq_length
        if self.lr_decay_style not in ("linear", "cosine", "constant", "inverse-square-root"):
            raise ValueError(
                f"MegatronLMPlugin(lr_decay_style={self.lr_decay_style!r}): use linear, cosine, constant or "
                "inverse-square-root."
            )
        if isinstance(self.min_lr, bool) or not isinstance(self.min_lr, (int, float)) or self.min_lr < 0:
            raise ValueError(f"MegatronLMPlugin(min_lr={self.min_lr!r}): expected a number >= 0.")
        if self.gradient_clipping is not None and (
            isinstance(self.gradient_clipping, bool) or float(self.gradient_clipping) < 0
        ):
            raise ValueError(
                f"MegatronLMPlugin(gradient_clipping={self.gradient_clipping!r}): expected a number >= 0, or None."
            )

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        """Records the batch arguments: ``global_batch_size = dp_degree x micro_batch_size x num_micro_batches``."""
        self.data_parallel_size = dp_degree
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = dp_degree * micro_batch_size * self.num_micro_batches

    def clear_training_args(self) -> None:
        """Forgets the batch arguments (``MegatronStrategy.teardown``: the dataloaders they described are gone)."""
        self.data_parallel_size = self.micro_batch_size = self.global_batch_size = None

    def check_world_size(self, world_size: int) -> int:
        """The data-parallel size for ``world_size`` processes; a clear error when ``tp_degree x pp_degree`` does
        not divide it."""
        model_parallel = self.tp_degree * self.pp_degree
        if world_size % model_parallel != 0:
            divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
            raise ValueError(
                f"MegatronLMPlugin(tp_degree={self.tp_degree}, pp_degree={self.pp_degree}) does not divide the "
                f"{world_size} processes of this run: the processes are split into model-parallel groups of "
                f"tp_degree x pp_degree = {model_parallel}. Use a tp_degree x pp_degree in {divisors} "
                "(--megatron-tp-degree, --megatron-pp-degree / ACCEL_MEGATRON_TP_DEGREE, ACCEL_MEGATRON_PP_DEGREE), or "
                f"start a multiple of {model_parallel} processes."
            )
        return world_size // model_parallel

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MegatronLMPlugin:
        """The plugin described by the ``ACCEL_MEGATRON_*`` variables (``accel launch --use-megatron ...``).

        environ: the run's settled variables (``RunSettings.environ``); None settles this process's environment
        (``accel_core.settings.settle_environment``), as ``Accelerator()`` would."""
        if environ is None:
            environ = settle_environment().environ
        return cls(**env.parse_backend_options("megatron", ENV_OPTIONS, environ, label="Megatron"))

    def to_env(self) -> dict[str, str]:
        """The ``ACCEL_MEGATRON_*`` variables that rebuild this plugin in launched processes (non-defaults only)."""
        defaults = type(self)()
        result: dict[str, str] = {}
        for f in fields(self):
            if not f.init:  # set while preparing, in each process
                continue
            value = getattr(self, f.name)
            if value == getattr(defaults, f.name):
                continue
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            result[f"ACCEL_MEGATRON_{f.name.upper()}"] = text
        return result
