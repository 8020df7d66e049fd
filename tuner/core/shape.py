"""The shape of a run's ranks: ``world_size`` ranks as a ``dp × tp`` mesh.

Torch-free, and the one place the rules about a shape live:

    world size = dp × tp        (tp = 1 without tensor parallelism)
    global batch = micro batch × accumulation steps × dp

The ``tp`` ranks of a data-parallel group compute one micro batch together, so a global
batch is split over the ``dp`` groups, never over all ranks. Code that needs the number of
data-parallel groups reads :attr:`MeshShape.dp`; nothing divides by ``tp`` by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.core.errors import BadInputError


@dataclass(frozen=True, slots=True, order=True)
class MeshShape:
    """``world_size`` ranks laid out as ``dp × tp`` (``tp`` divides ``world_size``)."""

    world_size: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for name, value in (("world size", self.world_size), ("tp", self.tp)):
            # bool is an int to Python, never a number of ranks.
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"{name} must be a positive integer, got {value!r}")
        if self.world_size % self.tp:
            raise BadInputError(
                f"world size {self.world_size} is not a multiple of tp {self.tp}: a mesh is "
                "dp × tp ranks, so give a world size that tp divides (or the tp that divides it)"
            )

    @classmethod
    def of(cls, dp: int, tp: int = 1) -> MeshShape:
        """The shape of ``dp`` data-parallel groups of ``tp`` ranks."""
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            raise BadInputError(f"dp must be a positive integer, got {dp!r}")
        return cls(dp * tp, tp)

    @property
    def dp(self) -> int:
        """The data-parallel groups: the ranks a global batch is split over."""
        return self.world_size // self.tp

    @property
    def is_mesh(self) -> bool:
        """Whether the ranks have a tensor-parallel dimension."""
        return self.tp > 1

    def per_group_batch(self, global_batch_size: int) -> int:
        """``B / dp``: the samples each data-parallel group runs in one optimizer step,
        refusing a global batch the groups cannot share exactly."""
        if isinstance(global_batch_size, bool) or global_batch_size < 1:
            raise BadInputError(
                f"global batch size must be a positive integer, got {global_batch_size}"
            )
        if global_batch_size % self.dp:
            if self.is_mesh:
                raise BadInputError(
                    f"global batch size {global_batch_size} is not divisible by the {self.dp} "
                    f"data-parallel groups of a {self.dp} × {self.tp} mesh: choose a global "
                    "batch that is a multiple of world size / tp"
                )
            raise BadInputError(
                f"global batch size {global_batch_size} is not divisible by world size "
                f"{self.world_size}: choose a global batch that is a multiple of the number "
                "of ranks"
            )
        return global_batch_size // self.dp

    def coordinates(self, rank: int) -> tuple[int, int]:
        """``(group, tp rank)`` of ``rank``: the ``tp`` ranks of a group are adjacent, so
        rank ``r`` is tensor-parallel rank ``r mod tp`` of data-parallel group ``⌊r / tp⌋``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise BadInputError(
                f"rank {rank!r} is not one of the {self.world_size} ranks of {self.where()}"
            )
        return divmod(rank, self.tp)

    def group_of(self, rank: int) -> int:
        """The data-parallel group of ``rank``: the samples it draws (``make_batch(n,
        rank=group)``, ``DistributedSampler(num_replicas=dp, rank=group)``)."""
        return self.coordinates(rank)[0]

    def ranks_of(self, group: int) -> range:
        """The ranks of data-parallel group ``group``."""
        if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < self.dp:
            raise BadInputError(f"group {group!r} is not one of the {self.dp} of {self.where()}")
        return range(group * self.tp, (group + 1) * self.tp)

    def bounds(self, other: MeshShape) -> bool:
        """Whether a rank at this shape holds at least what a rank at ``other`` holds:
        ``dp`` and ``tp`` both no larger here (a rank's memory does not grow with either,
        since both only divide what it holds)."""
        return self.dp <= other.dp and self.tp <= other.tp

    def where(self) -> str:
        """``world size 4``, or ``2 × 2 mesh (dp × tp)``."""
        if self.is_mesh:
            return f"{self.dp} × {self.tp} mesh (dp × tp)"
        return f"world size {self.world_size}"

    def ranks_words(self) -> str:
        """How a global batch's sentence names the ranks: `` × 4 ranks``, `` × 2
        data-parallel groups of 2 ranks``, or nothing for one process."""
        if self.is_mesh:
            return f" × {self.dp} data-parallel groups of {self.tp} ranks"
        return f" × {self.world_size} ranks" if self.world_size > 1 else ""

    def flags(self) -> tuple[str, ...]:
        """The ``tuner`` flags that name this shape."""
        mesh = ("--tp", str(self.tp)) if self.is_mesh else ()
        return ("--world-size", str(self.world_size), *mesh)

    def __str__(self) -> str:
        return f"{self.dp} × {self.tp}" if self.is_mesh else f"{self.world_size}"


ONE_PROCESS = MeshShape()
