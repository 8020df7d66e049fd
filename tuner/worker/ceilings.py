"""How much of its host a worker gives one job: its owner's ceilings.

A job's settings come from anyone with a ``write`` token. Memory limit, warm-up steps and
size cap decide how much memory and time a profile takes (``warmup_steps`` 2³¹ − 1 held a
worker through three timeouts; a "1 TiB" limit ran on a 64 MiB worker), so each is at
most what the worker's owner set: ``--memory-limit`` (else the device's own memory),
``--max-warmup-steps`` and ``--max-size-cap``. Time needs no setting of its own: a job
cannot ask for any, and ``--job-timeout`` ends every run.

A job over a ceiling is refused, not clamped: a clamped job would store a profile of
something other than what was asked (a smaller size cap caps M*, a smaller limit measures
another device), under the asker's name. It fails at once, for good, with one line that
says which setting, the ceiling, and what to do. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.core.units import format_bytes
from tuner.core.wire.jobs import JobSettings

# A probe needs 2 warm-up steps (the protocol); 10 leaves room for slow-settling
# allocators and compilation while bounding the time a job can hold the worker.
DEFAULT_MAX_WARMUP_STEPS = 10
# The job's own default is 4096; a larger search is the worker owner's decision.
DEFAULT_MAX_SIZE_CAP = 4096


@dataclass(frozen=True)
class Ceilings:
    """The most a job may ask of this worker."""

    memory_limit_bytes: int  # the worker's --memory-limit, or its device's memory
    warmup_steps: int = DEFAULT_MAX_WARMUP_STEPS
    size_cap: int = DEFAULT_MAX_SIZE_CAP

    def refusal(self, settings: JobSettings, *, worker: str) -> str | None:
        """The one line a job over a ceiling fails with; None when it fits them all."""
        over = []
        asked = settings.memory_limit_bytes
        if asked is not None and asked > self.memory_limit_bytes:
            over.append(
                f"memory_limit_bytes {format_bytes(asked)} is above the "
                f"{format_bytes(self.memory_limit_bytes)} this worker allows (its --memory-limit)"
            )
        if settings.warmup_steps > self.warmup_steps:
            over.append(
                f"warmup_steps {settings.warmup_steps} is above the {self.warmup_steps} this "
                "worker allows (its --max-warmup-steps)"
            )
        if settings.size_cap > self.size_cap:
            over.append(
                f"size_cap {settings.size_cap} is above the {self.size_cap} this worker "
                "allows (its --max-size-cap)"
            )
        if not over:
            return None
        return (
            f"worker {worker!r} refuses the job: {', and '.join(over)}; queue it within "
            f"{'that' if len(over) == 1 else 'them'}, or ask the worker's owner to raise "
            f"{'it' if len(over) == 1 else 'them'}"
        )
