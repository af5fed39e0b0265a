"""Where a prepared loader is in its epochs, saved and restored (``state_dict`` / ``load_state_dict``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from .rng_states import RawStates, from_plain, to_plain
from .samplers import ensure_generator

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from .sharding import Head, ShardPlan

logger = logging.getLogger(__name__)

# What a resume does when the data changed under a mid-epoch checkpoint: "error" (default) or "restart_epoch".
DATA_CHANGED_ENV = "ACCEL_DATA_CHANGED"
_LAYOUT_NAMES = {"dataset_length": "dataset length", "batch_size": "batch size", "drop_last": "drop_last"}


@dataclass
class _Progress:
    """Where a loader is, shared with the loaders ``skip_first_batches`` derives from it."""

    epoch: int = 0
    position: int = 0  # steps of the current epoch consumed, skipped ones included
    in_epoch: bool = False
    # The step handed out last was the epoch's final one (every process's last): the epoch is over but for
    # the StopIteration, so a state saved now is the next epoch's start (see ResumableMixin.state_dict).
    epoch_done: bool = False
    generator_state: torch.Tensor | None = None  # the sampler generator's state when the epoch began
    # The state of what torch drew the epoch's iterator base seed (worker seeds) from: the loader's
    # generator, else the global RNG. A resumed epoch draws it again from there (see _base_iter).
    seed_state: torch.Tensor | None = None
    resume_seed_state: torch.Tensor | None = None
    inner_state: dict[str, Any] | None = None  # StatefulDataLoader state after the last yielded step
    resume_skip: int = 0  # steps to skip at the next iteration only (load_state_dict)
    resume_inner: dict[str, Any] | None = None
    # Resuming a stream from torchdata's state starts mid-epoch: the first batches of the epoch,
    # which pad the last step, travel in the state too.
    head: Head[Any] | None = None
    resume_head: list[Any] | None = None


class ResumableMixin:
    """``state_dict`` / ``load_state_dict`` / ``skip_first_batches`` of the prepared loaders.

    Uses the loader's ``_progress``, ``_generator``, ``_seedable``, ``_skip``, ``_stateful``, ``_shard``,
    ``_sync_draw``, ``_rng_synced``, ``num_processes`` and ``split_batches`` (set up by ``ShardedLoaderMixin``).
    """

    _progress: _Progress
    _generator: torch.Generator | None
    _seedable: Any
    _skip: int
    _stateful: bool
    _shard: Any
    _sync_draw: bool
    _rng_synced: bool
    num_processes: int
    split_batches: bool
    dataset: Dataset[Any]  # the DataLoader's

    def _current_plan(self) -> ShardPlan:
        raise NotImplementedError  # ShardedLoaderMixin's

    def state_dict(self) -> dict[str, Any]:
        """Position of the loader: epoch, steps consumed in it, sampler seed / generator state.

        Loading it into the same loader in a new run makes the next iteration yield exactly the
        steps the interrupted epoch had left (map-style: skipped in the batch sampler, no sample read).
        """
        p = self._progress
        # After the epoch's last step (a checkpoint inside the loop, or a loop left with `break` there) the
        # next iteration is the next epoch's, as after the StopIteration: saved as its start, with the
        # generator's state now (the sampler was read to its end to tell the last step, so its draws for
        # this epoch are done) and no replay of this epoch's draws. Saved as "this epoch, every step
        # consumed", a resume got an empty pass, and `skip_first_batches(loader, 0)` this epoch's order again.
        done = p.in_epoch and p.epoch_done
        in_epoch = p.in_epoch and p.position > 0 and not done
        generator_state = p.generator_state if in_epoch else None
        if generator_state is None and self._generator is not None:
            generator_state = self._generator.get_state()
        return {
            "epoch": p.epoch + 1 if done else p.epoch,
            "batches_yielded": p.position if in_epoch else 0,
            "num_processes": self.num_processes,
            "split_batches": self.split_batches,
            "generator_state": generator_state,
            "seed": self._seedable.initial_seed if self._seedable is not None else None,
            "base_seed_state": p.seed_state if in_epoch else None,
            "inner": p.inner_state if in_epoch else None,
            "head": list(p.head.batches) if in_epoch and p.inner_state is not None and p.head is not None else None,
            "sampler_draw": to_plain(drawn) if in_epoch and (drawn := self._drawn_from()) is not None else None,
            # What the position means: a mid-epoch position counts steps of this layout (checked at load).
            **self._layout(),
        }

    def _layout(self) -> dict[str, Any]:
        """The data layout a saved position counts in: dataset length (None for a stream), batch size, drop_last."""
        plan = self._current_plan()
        return {"dataset_length": self._dataset_length(), "batch_size": plan.batch_size, "drop_last": plan.drop_last}

    def _dataset_length(self) -> int | None:
        dataset = self.dataset
        if isinstance(dataset, IterableDataset):
            return None  # a stream is read again up to the position: its length is not what the position counts
        try:
            return len(dataset)  # pyright: ignore[reportArgumentType]  # a map-style dataset without __len__: None
        except TypeError:
            return None

    def _check_layout(self, state_dict: dict[str, Any], position: int) -> int:
        """The position to resume at, once the saved layout is compared with the loader's now.

        A changed dataset length, batch size or drop_last makes a mid-epoch position meaningless: the epoch's order
        was drawn over the old dataset and the steps to skip counted in the old batches (resumed as is, 64 -> 80
        samples saw 9 to 14 samples twice and missed others, without a word). Refused by default; with
        ``ACCEL_DATA_CHANGED=restart_epoch`` the interrupted epoch restarts from its first step over the data of now,
        said in a warning. At an epoch's start (position 0) nothing is counted yet: the change is only reported.
        """
        now = self._layout()
        changed = [
            f"{_LAYOUT_NAMES[key]} {state_dict[key]} -> {now[key]}"
            for key in now
            if key in state_dict and state_dict[key] != now[key]  # states saved before these keys: not compared
        ]
        if not changed:
            return position
        what = ", ".join(changed)
        epoch = int(state_dict.get("epoch", 0))
        if position == 0:
            logger.warning(
                "The dataloader's data changed since the checkpoint (%s). The checkpoint was taken at the start of "
                "epoch %d, so the resumed run reads that epoch whole, over the data of now.",
                what,
                epoch,
            )
            return 0
        policy = os.environ.get(DATA_CHANGED_ENV, "error").strip().lower() or "error"
        if policy not in ("error", "restart_epoch"):
            raise ValueError(f"{DATA_CHANGED_ENV}={policy!r}: use 'error' (the default) or 'restart_epoch'.")
        if policy == "error":
            raise ValueError(
                f"Cannot resume the dataloader mid-epoch: its data changed since the checkpoint ({what}). The "
                f"checkpoint had consumed {position} steps of epoch {epoch}, counted in the old layout, so resuming "
                "there would repeat some samples and skip others. Resume with the data the checkpoint was saved "
                f"with, or set {DATA_CHANGED_ENV}=restart_epoch to restart epoch {epoch} from its first step over the "
                "data of now."
            )
        logger.warning(
            "The dataloader's data changed since the checkpoint (%s); %s=restart_epoch: epoch %d restarts from its "
            "first step over the data of now (the checkpoint had consumed %d of its steps, which are read again).",
            what,
            DATA_CHANGED_ENV,
            epoch,
            position,
        )
        return 0

    def _drawn_from(self) -> RawStates | None:
        """The RNG states the current pass's sampler drew its order from (a sampler without a generator)."""
        shard = self._shard
        return shard.drawn_from if shard is not None and shard.track_draw else None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores ``state_dict()``; the next iteration resumes the saved epoch where it stopped.

        A different number of processes is fine when the consumed steps convert to whole steps. A different
        dataset length, batch size or ``drop_last`` mid-epoch is refused (``ValueError`` naming the change), or, with
        ``ACCEL_DATA_CHANGED=restart_epoch``, restarts the interrupted epoch (see ``_check_layout``).
        """
        p = self._progress
        position = int(state_dict.get("batches_yielded", 0))
        # Before anything changes: a refused layout leaves the loader as it was.
        position = self._check_layout(state_dict, position)
        self._rng_synced = False  # a loaded generator state or seed: synchronised again at the next epoch
        p.epoch = int(state_dict.get("epoch", 0))
        saved_n = int(state_dict.get("num_processes", self.num_processes))
        saved_split = bool(state_dict.get("split_batches", self.split_batches))
        if (saved_n, saved_split) != (self.num_processes, self.split_batches):
            underlying = position * (1 if saved_split else saved_n)
            per_step = 1 if self.split_batches else self.num_processes
            if underlying % per_step:
                raise ValueError(
                    f"Cannot resume: the checkpoint consumed {underlying} batches of the original loader, "
                    f"which is not a whole number of steps of {per_step} batches with {self.num_processes} "
                    "processes. Resume with the original number of processes or split_batches setting."
                )
            position = underlying // per_step
        generator_state = state_dict.get("generator_state")
        shard = self._shard
        if generator_state is not None and self._generator is None and shard is not None and shard.track_draw:
            # Saved by processes that shared the sampler through a generator (another world size: an elastic
            # job shrunk to one process, a sharded checkpoint continued on one): continue with that generator
            # as the saving run would, so the resumed epoch reads each remaining sample once and later epochs
            # keep the saving run's orders.
            self._generator = ensure_generator(shard.draw_sampler, create=True)
            if self._generator is not None:
                shard.track_draw = False
                self._sync_draw = False
        if generator_state is not None and self._generator is not None:
            self._generator.set_state(generator_state)
        if state_dict.get("seed") is not None and self._seedable is not None:
            self._seedable.initial_seed = int(state_dict["seed"])
        inner = state_dict.get("inner")
        if inner is not None and self._stateful and self._shard is None:
            p.resume_inner, p.resume_skip = inner, 0
            p.resume_head = state_dict.get("head")
        else:
            p.resume_inner, p.resume_skip = None, max(position - self._skip, 0)
        seed_state = state_dict.get("base_seed_state")
        p.resume_seed_state = seed_state if position > 0 else None
        p.seed_state = p.resume_seed_state
        # A "lookahead_rng" entry (RNG states before a batch read ahead, saved before the loader without workers
        # stopped reading batches ahead) is not needed: that batch is now read after the step, from the restored RNGs.
        if self._shard is not None and self._shard.track_draw:
            # The resumed pass reads its sampler's first item from the interrupted pass's states (see
            # BatchSamplerShard._started): same order, the checkpoint's RNG states left alone.
            draw = state_dict.get("sampler_draw")
            self._shard.replay_from = from_plain(draw) if draw is not None and position > 0 else None
            self._shard.drawn_from = self._shard.replay_from
        # Saving again before iterating must give back the same position.
        p.position, p.in_epoch, p.epoch_done = position, position > 0, False
        p.generator_state = self._generator.get_state() if self._generator is not None else None
        p.inner_state = inner

    def _with_skip(self, num_batches: int) -> ResumableMixin:
        """A loader over the same data and progress whose iterations skip ``num_batches`` more steps.

        The count is from the start of the epoch and replaces a position that ``load_state_dict``
        restored and no iteration used yet: scripts written for Accelerate restore the state, then
        skip the batches they had consumed themselves, and must not skip twice.
        """
        import copy

        p = self._progress
        p.resume_skip, p.resume_inner, p.resume_head = 0, None, None
        clone = copy.copy(self)
        clone.__dict__["_iterator"] = None
        clone.__dict__["_skip"] = self._skip + int(num_batches)
        return clone
