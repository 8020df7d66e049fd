"""What the framework integrations share: the worst case of the user's own training data,
batches of it for the probes, and the one call that plans from a workload built out of
the user's own training (:mod:`tuner.train.lightning`, :mod:`tuner.train.huggingface`).

The worst case comes from the data: the sample that takes the most memory is the longest
one, so a probe's batch is ``n`` copies of it, collated by the training's own collator
(padding to the longest sample costs what a batch of that sample costs). Finding it reads
every sample when the user names their lengths (``lengths=dataset["length"]``), else a
bounded scan: at most ``scan`` samples, spread evenly over a dataset with a length (the
first ``scan`` of a stream). A dataset whose longest sample hides between the scanned ones
is profiled too small; naming the lengths finds it exactly.

    global batch = micro batch × accumulation steps × data-parallel ranks
"""

from __future__ import annotations

import copy
import itertools
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tuner.core import plan as plans
from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.shape import MeshShape
from tuner.core.units import format_bytes, parse_bytes
from tuner.engine.batching import Batch
from tuner.engine.outcome import DEFAULT_HEADROOM
from tuner.engine.state import preserved_rng
from tuner.engine.workload import Workload

if TYPE_CHECKING:
    from tuner.client import TunerClient
    from tuner.core.speeds import SpeedCurve
    from tuner.train.fastest import TimedSplit

# How many samples a scan reads when the user names no lengths: enough to meet the long
# tail of most text sets, few enough to take seconds, not minutes.
DEFAULT_SCAN = 1024

log = logging.getLogger("tuner.train")


def sample_size(sample: object) -> int:
    """How much a sample holds: a tensor's or an array's elements, a sequence's items, a
    string's characters, summed over the fields of a mapping, tuple or list of fields."""
    if isinstance(sample, torch.Tensor):
        return sample.numel()
    size = getattr(sample, "size", None)
    if isinstance(size, int) and hasattr(sample, "shape"):  # a numpy array
        return size
    if isinstance(sample, str | bytes):
        return len(sample)
    if isinstance(sample, Mapping):
        return sum(sample_size(value) for value in sample.values())
    if isinstance(sample, list | tuple):
        if all(isinstance(item, int | float | bool) for item in sample):
            return len(sample)
        return sum(sample_size(item) for item in sample)
    return 1


@dataclass(frozen=True)
class WorstCase:
    """The sample a probe's batches are made of, and how it was found."""

    sample: Any
    index: int
    size: int
    searched: int
    named_lengths: bool

    def describe(self) -> str:
        how = (
            "the longest of the lengths given"
            if self.named_lengths
            else f"the largest of {self.searched} samples scanned"
        )
        return f"sample {self.index} ({self.size} elements, {how})"


def longest_sample(
    dataset: Any, *, lengths: Sequence[int] | None = None, scan: int = DEFAULT_SCAN
) -> WorstCase:
    """The sample of ``dataset`` that takes the most memory: the longest by ``lengths``
    (one per sample) when given, else the largest (:func:`sample_size`) of at most ``scan``
    samples, spread evenly over the dataset. Reading samples leaves the RNG as it was."""
    if not isinstance(scan, int) or isinstance(scan, bool) or scan < 1:
        raise BadInputError(f"scan={scan!r}: give how many samples to read, at least 1")
    with preserved_rng():
        if lengths is not None:
            return _by_lengths(dataset, list(lengths))
        return _by_scan(dataset, scan)


def _by_lengths(dataset: Any, lengths: list[int]) -> WorstCase:
    count = _length_of(dataset)
    if count is not None and len(lengths) != count:
        raise BadInputError(
            f"lengths has {len(lengths)} entries but the dataset holds {count} samples: give "
            "one length per sample, e.g. lengths=dataset['length']"
        )
    if not lengths:
        raise BadInputError("lengths is empty: the training set holds no sample to profile")
    index = max(range(len(lengths)), key=lambda i: (lengths[i], -i))
    # A stream is read up to the sample; a map-style set is indexed.
    stream = count is None
    sample = next(itertools.islice(iter(dataset), index, None)) if stream else dataset[index]
    return WorstCase(
        _detached(sample), index, int(lengths[index]), len(lengths), named_lengths=True
    )


def _by_scan(dataset: Any, scan: int) -> WorstCase:
    count = _length_of(dataset)
    if count is None:
        indexed: Any = enumerate(itertools.islice(iter(dataset), scan))
    else:
        if count == 0:
            raise BadInputError("the training set is empty: there is no sample to profile")
        # Spread evenly, so that a set sorted by length (or grouped by source) is seen whole.
        reads = min(scan, count)
        indices = [i * count // reads for i in range(reads)]
        indexed = ((i, dataset[i]) for i in indices)
    best: tuple[int, int, Any] | None = None
    searched = 0
    for index, sample in indexed:
        searched += 1
        size = sample_size(sample)
        if best is None or size > best[0]:
            best = (size, index, sample)
    if best is None:
        raise BadInputError("the training set yielded no sample: there is nothing to profile")
    size, index, sample = best
    return WorstCase(_detached(sample), index, size, searched, named_lengths=False)


def _length_of(dataset: Any) -> int | None:
    """The number of samples of a map-style dataset; ``None`` for a stream."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        return None
    try:
        return len(dataset)
    except TypeError:
        return None


def _detached(sample: Any) -> Any:
    # A copy of its own, so that a collator that edits samples in place (padding labels)
    # never edits the user's dataset.
    return copy.deepcopy(sample)


def repeated_batches(
    collate: Callable[[list[Any]], Batch],
    worst: WorstCase,
    *,
    after: Callable[[Batch], Batch] | None = None,
) -> Callable[..., Batch]:
    """``make_batch(n)``: ``n`` copies of the worst-case sample through the training's own
    collator (then ``after``, the framework's own batch hooks), with the RNG put back (a
    collator that masks tokens at random draws from it)."""

    def make_batch(n: int, rank: int = 0) -> Batch:
        del rank  # every rank's worst case is the same sample
        with preserved_rng():
            # Shallow copies: a collator that sets a field of a sample sets it on its own copy.
            batch = collate([copy.copy(worst.sample) for _ in range(n)])
            return after(batch) if after is not None else batch

    return make_batch


def memory_limit_bytes(memory_limit: int | str | None) -> int | None:
    """``memory_limit`` as bytes: a count, or text such as ``"2GiB"``."""
    if memory_limit is None:
        return None
    if isinstance(memory_limit, str):
        return parse_bytes(memory_limit)
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, int) or memory_limit < 1:
        raise BadInputError(
            f"memory_limit={memory_limit!r}: give a positive number of bytes or text such as '2GiB'"
        )
    return memory_limit


def check_global_batch_size(global_batch_size: object) -> int:
    if (
        isinstance(global_batch_size, bool)
        or not isinstance(global_batch_size, int)
        or global_batch_size < 1
    ):
        raise BadInputError(
            f"global_batch_size={global_batch_size!r}: give the samples per optimizer step "
            "across all ranks, a positive whole number"
        )
    return global_batch_size


def check_device(device: str | None, model_device: torch.device) -> str:
    """The device to probe on: ``device``, by default the one the model is on. Probing on
    another would move the user's model there."""
    chosen = torch.device(device) if device is not None else model_device
    if chosen.type != model_device.type:
        raise BadInputError(
            f"device={device!r} but the model is on {model_device}: probe where it trains "
            f"(device={str(model_device)!r}), or leave device out"
        )
    return str(chosen)


@dataclass(frozen=True)
class Tuned:
    """The answer for a framework: equal micro batches and the accumulation steps, with
    what was profiled (the workload built from the training, the worst case of its data)."""

    recommendation: plans.Recommendation
    micro_batch_size: int
    accumulation_steps: int
    data_parallel_size: int
    workload: Workload
    worst_case: WorstCase
    # With time_splits: the candidates timed (the fewest steps first), why the answer is
    # the one it is, and what timing cost.
    timed: tuple[TimedSplit, ...] = ()
    speeds: SpeedCurve | None = None
    timing_reason: str = ""
    timing_s: float = 0.0

    def describe(self) -> str:
        rec = self.recommendation
        ranks = self.data_parallel_size
        why = f"; {self.timing_reason}" if self.timing_reason else ""
        uneven = (
            f"; where micro batches may differ: {plans.format_runs(rec.split)}"
            if not rec.is_equal
            else ""
        )
        return (
            f"micro batch {self.micro_batch_size} × {self.accumulation_steps} accumulation "
            f"step{'s' if self.accumulation_steps != 1 else ''} × {ranks} "
            f"rank{'s' if ranks != 1 else ''} = {rec.global_batch_size} "
            f"(largest that fits: {rec.max_micro_batch_size}, {rec.basis}{uneven}{why})"
        )


def plan_own_training(
    workload: Workload,
    worst_case: WorstCase,
    *,
    global_batch_size: int,
    data_parallel_size: int,
    device: str,
    memory_limit: int | None,
    client: TunerClient | str | None,
    headroom: float = DEFAULT_HEADROOM,
    policy: str = plans.DEFAULT_POLICY,
    time_splits: bool = False,
) -> Tuned:
    """Profile ``workload`` (or use the stored profile), plan ``global_batch_size`` over
    ``data_parallel_size`` ranks, and take the answer's equal split, which the frameworks
    run (``recommendation.equal``; its warning, when it is much slower than the
    recommended split, is said once, by the process that plans). ``client``: a
    ``TunerClient``, a URL (``http(s)://…`` or ``sqlite:///…``), or ``None`` for
    ``TUNER_URL``, and without it the local database (:func:`local_store_url`), said in
    one line. With ``time_splits`` (one process only), the fewest micro batches are timed
    against more, smaller ones and the fastest kept when the paired rounds show it faster
    (:mod:`tuner.train.fastest`)."""
    from tuner.client import TunerClient
    from tuner.client.client import ClientSettings
    from tuner.train.integrations import EqualMicroBatchWarning, equal_settings
    from tuner.train.planning import plan_training

    # Refused before probing: a batch the ranks cannot share evenly.
    plans.per_rank_batch(global_batch_size, MeshShape(data_parallel_size))
    if client is None and not ClientSettings().url:
        client = local_store_url()
        if _plans_here():
            log.warning(
                "tuner: no client= or TUNER_URL, so profiles are kept in %s (the database "
                "`tuner serve` uses by default)",
                client,
            )
    # A URL is opened here, by the process that plans, rank 0 alone under torch.distributed
    # (a client does not cross the pickling of a spawned rank; a URL does).
    opened: TunerClient | None = None
    if isinstance(client, str):
        given = opened = TunerClient(client) if _plans_here() else None
    else:
        given = client
    try:
        recommendation = plan_training(
            workload,
            global_batch_size=global_batch_size,
            world_size=data_parallel_size,
            device=device,
            memory_limit_bytes=memory_limit,
            headroom=headroom,
            policy=policy,
            client=given,
        )
    finally:
        if opened is not None:
            opened.close()
    micro, steps = equal_settings(recommendation)
    tuned = Tuned(recommendation, micro, steps, data_parallel_size, workload, worst_case)
    if time_splits:
        tuned = _timed(tuned, device=device, memory_limit=memory_limit, headroom=headroom)
    warning = recommendation.equal.warning
    if warning is not None and not tuned.timing_reason and _plans_here():
        warnings.warn(warning, EqualMicroBatchWarning, stacklevel=3)
    limit = f" under {format_bytes(memory_limit)}" if memory_limit else ""
    log.info(
        "tuner: %s on %s%s; worst case: %s", tuned.describe(), device, limit, worst_case.describe()
    )
    return tuned


def local_store_url() -> str:
    """The database kept in the user's data directory (``~/.local/share/microbatch-tuner/
    tuner.db`` on Linux): the one ``tuner serve`` and ``tuner db`` use when
    ``TUNER_DATABASE_URL`` names none."""
    from platformdirs import user_data_path

    directory = user_data_path("microbatch-tuner", appauthor=False)
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / 'tuner.db'}"


def _timed(tuned: Tuned, *, device: str, memory_limit: int | None, headroom: float) -> Tuned:
    """``tuned`` with the fastest of its candidate micro batches, timed in this process."""
    import dataclasses

    import torch.distributed as dist

    from tuner.train.fastest import (
        candidate_micro_batches,
        fastest,
        time_micro_batches,
        timed_splits,
    )
    from tuner.train.planning import training_backend

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # Ranks timing on their own could choose differently, and one rank's step is not
        # the step DDP runs: under several ranks the plan stays the fewest steps.
        return dataclasses.replace(
            tuned, timing_reason="not timed: time_splits runs in one process only"
        )
    per_rank = tuned.recommendation.per_rank_batch_size
    sizes = candidate_micro_batches(per_rank, tuned.micro_batch_size)
    if len(sizes) == 1:
        return tuned
    started = time.perf_counter()
    speeds = time_micro_batches(
        tuned.workload, training_backend(device, memory_limit), sizes=sizes, headroom=headroom
    )
    chosen, reason = fastest(speeds, per_rank, sizes)
    return dataclasses.replace(
        tuned,
        micro_batch_size=chosen,
        accumulation_steps=per_rank // chosen,
        speeds=speeds,
        timed=tuple(timed_splits(speeds, per_rank)),
        timing_reason=reason,
        timing_s=time.perf_counter() - started,
    )


def _plans_here() -> bool:
    """Whether this process plans: always, but under torch.distributed only rank 0 (the
    others receive its plan)."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def loss_of(output: object, where: str) -> torch.Tensor:
    """The loss in what a training step returned: a tensor, or a mapping with ``loss``."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, torch.Tensor):
        raise WorkloadError(
            f"{where} returned {type(output).__name__} for the worst-case batch, not a loss: "
            "return the loss tensor (or a dict with 'loss') to be profiled"
        )
    return loss
