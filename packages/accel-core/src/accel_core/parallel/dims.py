"""The job's one named ``DeviceMesh`` and the process groups everything asks for ("which processes?").

``ParallelDims`` holds the resolved ``ParallelismConfig`` and the mesh built from it (or adopted
from a mesh the user built). Dataloaders shard over ``dims.dp``, metrics gather over it, tensor
parallelism uses ``dims.submesh("tp")``, FSDP2 ``dims.submesh("dp_shard_cp")`` (HSDP:
``("dp_replicate", "dp_shard_cp")``). A group spanning every process is reported as ``None``
(the default group), so a plain data-parallel job uses exactly the group it always used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .config import MESH_DIMS, ParallelismConfig, config_from_sizes

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

# Flattened views of several dimensions, named as in the reference (and torchtitan).
FLATTENED = {
    "dp": ("dp_replicate", "dp_shard"),
    "dp_shard_cp": ("dp_shard", "cp"),
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),
}
# What the views with cp are without a cp dimension (no group of their own).
_WITHOUT_CP = {"dp_shard_cp": "dp_shard", "dp_cp": "dp"}


@dataclass(frozen=True)
class MeshGroup:
    """Some processes of the job seen from this one: how many, which one am I, and their group.

    group: the ``ProcessGroup``; ``None`` when it is every process (the default group) — or when
        ``size`` is 1 (this process alone: nothing to communicate).
    """

    size: int
    rank: int
    group: dist.ProcessGroup | None = None


class ParallelDims:
    """The resolved layout of the job and its mesh (``None`` for one process without a process group).

    Example::

        dims = accelerator.parallel_dims
        dims.dp.size, dims.dp.rank          # data-parallel world and this process's place in it
        dims.submesh("tp")                  # the tensor-parallel sub-mesh
    """

    def __init__(
        self,
        config: ParallelismConfig,
        mesh: DeviceMesh | None,
        world_size: int,
        rank: int,
        views: dict[str, DeviceMesh] | None = None,
    ) -> None:
        self.config = config
        self.mesh = mesh
        self.world_size = world_size
        self.rank = rank
        # The flattened meshes, kept as ``_flatten`` returned them (torch deprecates slicing them from the root).
        self.views = dict(views or {})
        self._groups: dict[str, MeshGroup] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Process groups do not travel; the mesh does (by group name), and groups are looked up again.
        return {**self.__dict__, "_groups": {}}

    @property
    def names(self) -> tuple[str, ...]:
        """Dimension names of the mesh (empty without a mesh)."""
        return tuple(self.mesh.mesh_dim_names or ()) if self.mesh is not None else ()

    def submesh(self, *names: str) -> DeviceMesh:
        """The sub-mesh over ``names``: a dimension or a flattened view (``dp``, ``dp_shard_cp``, ``dp_cp``),
        or several dimensions in the given order."""
        if self.mesh is None:
            raise ValueError("This job has no device mesh (one process without a process group).")
        if len(names) == 1:
            name = self._resolve(names[0])
            return self.views[name] if name in self.views else self.mesh[name]
        return self.mesh[names]

    def _resolve(self, name: str) -> str:
        """Without a cp dimension, ``dp_cp`` is the ``dp`` view and ``dp_shard_cp`` the ``dp_shard`` dimension
        (``flattened_views`` creates no group for them)."""
        if name in _WITHOUT_CP and name not in self.views and "cp" not in self.names:
            return _WITHOUT_CP[name]
        return name

    def has(self, name: str) -> bool:
        """Whether ``name`` (a dimension or a flattened view) can be addressed on the mesh."""
        name = self._resolve(name)
        return name in self.names or name in self.views

    def group(self, name: str) -> MeshGroup:
        """The processes along ``name``: a dimension, a flattened view (``dp``, ``dp_cp``...) or ``world``."""
        found = self._groups.get(name)
        if found is not None:
            return found
        if name != "world" and self._config_size(name) == 1:
            found = MeshGroup(1, 0, None)
        elif name == "world" or self.mesh is None:
            size = self.world_size if name == "world" else self._config_size(name)
            found = MeshGroup(size, self.rank if size == self.world_size else 0, None)
        else:
            sub = self.submesh(name)
            size = sub.size()
            found = MeshGroup(size, sub.get_local_rank(), None if size == self.world_size else sub.get_group())
        self._groups[name] = found
        return found

    def _config_size(self, name: str) -> int:
        dims = FLATTENED.get(name, (name,))
        size = 1
        for dim in dims:
            size *= self.config.size(dim)
        return size

    @property
    def dp(self) -> MeshGroup:
        """Data parallelism: processes that read different batches (``dp_replicate x dp_shard``)."""
        return self.group("dp")

    @property
    def tp(self) -> MeshGroup:
        return self.group("tp") if self.config.tp_enabled else MeshGroup(1, 0, None)

    @property
    def cp(self) -> MeshGroup:
        return self.group("cp") if self.config.cp_enabled else MeshGroup(1, 0, None)

    def local_rank(self, dim: str) -> int:
        """This process's coordinate along ``dim`` (0 when the dimension is not used)."""
        return self.group(dim).rank if self.config.size(dim) > 1 else 0

    def __repr__(self) -> str:
        return f"ParallelDims({self.config.describe()}, mesh={self.mesh})"


def mesh_dims(config: ParallelismConfig) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Names and sizes of the mesh for ``config``: every dimension larger than 1, and both
    data-parallel ones always, so that FSDP2 (HSDP) can replicate over ``(dp_replicate, dp_shard)``
    even when one of them has size 1 (tensor parallel x replicas)."""
    names = tuple(d for d in MESH_DIMS if config.size(d) > 1 or d in ("dp_replicate", "dp_shard"))
    return names, tuple(config.size(d) for d in names)


def build_mesh(config: ParallelismConfig, device_type: str) -> DeviceMesh:
    """``init_device_mesh`` for ``config``. Collective."""
    from torch.distributed.device_mesh import init_device_mesh

    names, shape = mesh_dims(config)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def flattened_views(mesh: DeviceMesh) -> dict[str, DeviceMesh]:
    """The views that need new process groups: ``dp`` over the data-parallel dimensions, and with a ``cp``
    dimension ``dp_shard_cp`` and ``dp_cp``. Collective: every process creates them, in this order.

    Without ``cp`` those two are ``dp_shard`` and ``dp`` under another name: ``ParallelDims._resolve``
    maps them when asked (slicing is local). A mesh of data-parallel dimensions only flattens
    without slicing, which would import ``torch._dynamo`` (7 s of CPU per process on a small machine)
    in ``Accelerator()`` already, long before a plain DDP job needs it.
    """
    present = tuple(mesh.mesh_dim_names or ())
    views: dict[str, DeviceMesh] = {}
    for view, dims in FLATTENED.items():
        parts = tuple(d for d in dims if d in present)
        if view in present or (view != "dp" and "cp" not in parts) or not parts:
            continue  # a dimension of the mesh, or a view without cp (ParallelDims._resolve)
        views[view] = (mesh if parts == present else mesh[parts])._flatten(view)
    return views


def adopt_mesh(mesh: DeviceMesh, world_size: int) -> tuple[ParallelismConfig, DeviceMesh]:
    """The config a mesh the user built describes (and the mesh, named); raises ValueError when it cannot be the job's
    mesh.

    Unnamed meshes follow FSDP's convention: 1-D shards (``dp_shard``), 2-D is HSDP
    (``dp_replicate``, ``dp_shard``). Named ones must use the names of ``MESH_DIMS``.
    """
    if mesh.size() != world_size:
        raise ValueError(
            f"The device_mesh given covers {mesh.size()} of the job's {world_size} processes: a sub-mesh cannot say "
            "how the other processes read data. Pass the whole mesh (dimensions named dp_replicate / dp_shard / cp / "
            "tp), or describe the layout with Accelerator(parallelism_config=ParallelismConfig(...))."
        )
    names = tuple(mesh.mesh_dim_names or ())
    if not names:
        names = {1: ("dp_shard",), 2: ("dp_replicate", "dp_shard")}.get(mesh.ndim, ())
        if not names:
            raise ValueError(
                f"An unnamed {mesh.ndim}-D device_mesh is ambiguous: name its dimensions ({', '.join(MESH_DIMS)})."
            )
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh(mesh.device_type, mesh.mesh, mesh_dim_names=names)  # same ranks, now named
    unknown = [n for n in names if n not in MESH_DIMS and n not in FLATTENED]
    if unknown:
        raise ValueError(
            f"device_mesh dimension(s) {unknown} mean nothing to accel; name them from {', '.join(MESH_DIMS)} "
            "so that data is sharded over the data-parallel ones only."
        )
    return config_from_sizes(**{n: mesh.size(i) for i, n in enumerate(names) if n in MESH_DIMS}), mesh


def make_dims(
    config: ParallelismConfig,
    device_type: str,
    world_size: int,
    rank: int,
    provided: Any = None,
    has_group: bool = True,
) -> ParallelDims:
    """``ParallelDims`` for a resolved ``config``: the mesh given (``provided``) or a new one."""
    if provided is None and not has_group:
        return ParallelDims(config, None, world_size, rank)
    mesh = provided if provided is not None else build_mesh(config, device_type)
    return ParallelDims(config, mesh, world_size, rank, flattened_views(mesh))
