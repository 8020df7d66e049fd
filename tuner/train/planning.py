"""One call for a training script: the micro batch and accumulation steps for this
workload on this device, measured once and remembered by the service.

    global batch = micro batch × accumulation steps × world size

::

    from tuner.train.accumulate import Accumulator
    from tuner.client import TunerClient
    from tuner.train.planning import plan_training

    with TunerClient() as client:                       # TUNER_URL, TUNER_TOKEN
        plan = plan_training(workload, global_batch_size=512, device="cuda", client=client)
        accumulator = Accumulator.for_workload(
            workload, plan.micro_batch_size, on_oom=client.oom_reporter(plan)
        )
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import JsonValue

from tuner.answer.local import answer_from
from tuner.client import (
    CachedRecommendation,
    Fallback,
    OfflineRecommendation,
    TunerClient,
    TunerOfflineWarning,
)
from tuner.core import plan as plans
from tuner.core.errors import (
    BadInputError,
    NotFoundError,
    NothingFitsError,
    ServiceUnavailableError,
    TunerError,
)
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.wire.recommendation import RecommendationQuery
from tuner.engine.backends import Backend, make_backend
from tuner.engine.fingerprint import device_key, workload_key
from tuner.engine.outcome import DEFAULT_HEADROOM, DEFAULT_SIZE_CAP
from tuner.engine.profiler import nothing_fits_advice, profile_workload
from tuner.engine.workload import Workload

Missing = Literal["profile", "queue", "fail"]
MISSING: tuple[str, ...] = ("profile", "queue", "fail")


def training_backend(device: str | None, memory_limit_bytes: int | None) -> Backend:
    """The backend profiles of this run are measured on: ``device`` (default ``cuda`` when
    there is one, else ``cpu``, which needs ``memory_limit_bytes``)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and memory_limit_bytes is None:
        raise BadInputError(
            "device='cpu' needs memory_limit_bytes=..., the memory the step must fit in "
            "(on CPU every live tensor byte is counted against it)"
        )
    return make_backend(device, memory_limit_bytes=memory_limit_bytes)


def plan_training(
    workload: Workload,
    *,
    global_batch_size: int,
    world_size: int | None = None,
    device: str | None = None,
    memory_limit_bytes: int | None = None,
    headroom: float = DEFAULT_HEADROOM,
    policy: str = plans.DEFAULT_POLICY,
    missing: Missing = "profile",
    client: TunerClient | None = None,
    fallback: Fallback | None = None,
    strategy: str = "model",
    size_cap: int = DEFAULT_SIZE_CAP,
    options: Mapping[str, JsonValue] | None = None,
    job_timeout: float = 3600.0,
    poll_interval: float = 5.0,
) -> plans.Recommendation:
    """Micro batch and accumulation steps for ``workload`` on this device.

    global batch = micro batch × accumulation steps × dp

    (``dp``: the data-parallel groups of the run's mesh, ``world_size`` over
    ``workload.parallel.tp``; the world size without tensor parallelism.) The workload key
    and device key are computed here (the optimizer factory is called once, as profiling
    does). The service is asked for a recommendation; when it has no profile of this
    workload on this device (it has none, or only an estimate from another device),
    ``missing`` says what happens:

    - ``"profile"``: profile it in this process (the model, optimizer, RNG and train/eval
      flags are left as they were), upload the profile, and ask again.
    - ``"queue"``: queue a profiling job of ``workload.target`` (with ``options``) for a
      worker on this device and wait up to ``job_timeout`` seconds for it. The worker must
      allow the target (``tuner worker --allow``); else the job fails at once, saying so.
    - ``"fail"``: return the estimate if there is one, else raise ``NotFoundError``.

    When the service cannot be reached the client answers from its offline cache, or with
    ``fallback``, with one warning; failing both, ``"profile"`` measures here and plans from
    that profile, and the other modes raise ``ServiceUnavailableError``. ``client`` defaults
    to ``TunerClient()`` (``TUNER_URL``, ``TUNER_TOKEN``).

    The question carries the run's world size and ``workload.parallel``: a DDP or FSDP
    workload is answered from profiles measured that way (profiling it here runs
    ``world_size`` rank processes of its own); an answer from a one-process profile is
    ``estimated`` and says so (``caveat``), so ``"profile"`` and ``"queue"`` measure it.

    Under ``torch.distributed`` (initialised, more than one rank) rank 0 plans, alone, and
    broadcasts the plan or its error: every rank returns the same plan or raises the same
    error. ``world_size`` defaults to the process group's size there, else 1.
    """
    if missing not in MISSING:
        raise BadInputError(f"missing={missing!r}: use one of {', '.join(MISSING)}")
    group = _process_group_size()
    if world_size is None:
        world_size = group or 1
    planner = partial(
        _plan,
        workload,
        global_batch_size=global_batch_size,
        # Refused here, before any profiling, where tp does not divide the world.
        mesh=workload.parallel.mesh(world_size),
        device=device,
        memory_limit_bytes=memory_limit_bytes,
        headroom=headroom,
        policy=policy,
        missing=missing,
        client=client,
        fallback=fallback,
        strategy=strategy,
        size_cap=size_cap,
        options=options,
        job_timeout=job_timeout,
        poll_interval=poll_interval,
    )
    return planner() if group is None else _planned_on_rank_zero(planner)


def _process_group_size() -> int | None:
    """The size of the default process group when one with several ranks is running."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size()
    return size if size > 1 else None


def _planned_on_rank_zero(planner: Callable[[], plans.Recommendation]) -> plans.Recommendation:
    """``planner()`` on rank 0, its plan or its error broadcast to every rank.

    Any exception on rank 0 is sent, not only the tuner's own: a rank left waiting for a
    broadcast that never comes would hang the job. Rank 0 re-raises its own exception
    (with its traceback); the others raise the copy they received.
    """
    payload: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            payload = [("plan", planner())]
        except Exception as exc:
            failure = exc
            payload = [("error", _portable(exc))]
    dist.broadcast_object_list(payload, src=0)
    if failure is not None:
        raise failure
    kind, value = payload[0]
    if kind == "error":
        raise value
    plan: plans.Recommendation = value
    return plan


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling (the tuner's errors do), else a ``TunerError`` that
    says what rank 0 raised."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return TunerError(f"rank 0 could not plan: {type(exc).__name__}: {exc}")
    return exc


def _plan(
    workload: Workload,
    *,
    global_batch_size: int,
    mesh: MeshShape,
    device: str | None,
    memory_limit_bytes: int | None,
    headroom: float,
    policy: str,
    missing: Missing,
    client: TunerClient | None,
    fallback: Fallback | None,
    strategy: str,
    size_cap: int,
    options: Mapping[str, JsonValue] | None,
    job_timeout: float,
    poll_interval: float,
) -> plans.Recommendation:
    """:func:`plan_training` in this process alone."""
    backend = training_backend(device, memory_limit_bytes)
    owned = client is None
    client = client or TunerClient()
    planner = _Planner(
        client=client,
        workload=workload,
        backend=backend,
        workload_key=workload_key(workload, workload.build_optimizer()),
        device_key=device_key(backend),
        global_batch_size=global_batch_size,
        mesh=mesh,
        policy=policy,
        fallback=fallback,
        headroom=headroom,
        strategy=strategy,
        size_cap=size_cap,
        memory_limit_bytes=memory_limit_bytes,
        options=options,
    )
    try:
        try:
            answer = planner.ask()
        except NotFoundError:
            if missing == "fail":
                raise
        except ServiceUnavailableError:
            if missing != "profile":
                raise
            return planner.profile_here()
        else:
            # Offline answers are kept as they are: nothing measured here could be uploaded.
            offline = isinstance(answer, CachedRecommendation | OfflineRecommendation)
            if offline or answer.basis == "measured" or missing == "fail":
                return answer
        if missing == "queue":
            return planner.queue_and_wait(timeout=job_timeout, poll=poll_interval)
        return planner.profile_here()
    finally:
        if owned:
            client.close()


@dataclass(frozen=True)
class _Planner:
    """One question about one workload on one backend, and the ways to answer it."""

    client: TunerClient
    workload: Workload
    backend: Backend
    workload_key: str
    device_key: str
    global_batch_size: int
    mesh: MeshShape  # the run's ranks; ``workload.parallel.tp`` is its tp
    policy: str
    fallback: Fallback | None
    headroom: float
    strategy: str
    size_cap: int
    memory_limit_bytes: int | None
    options: Mapping[str, JsonValue] | None

    def question(self) -> RecommendationQuery:
        """The question this run asks, as every surface asks it."""
        return RecommendationQuery.at(
            self.mesh,
            workload=self.workload_key,
            device=self.device_key,
            global_batch_size=self.global_batch_size,
            parallel=self.workload.parallel.mode,
            policy=self.policy,
        )

    def ask(self, fallback: Fallback | None = None) -> plans.Recommendation:
        return self.client.ask(
            self.question(), fallback=fallback if fallback is not None else self.fallback
        )

    def profile_here(self) -> plans.Recommendation:
        """Profile in this process, upload, and ask again; plan here if the service is out
        of reach (warning once)."""
        profile = profile_workload(
            self.workload,
            self.backend,
            headroom=self.headroom,
            strategy=self.strategy,
            size_cap=self.size_cap,
            world_size=self.mesh.world_size,
            # The speed curve is timed for this run's splits (one process; ranks keep none).
            per_rank_batch_size=self.mesh.per_group_batch(self.global_batch_size),
        )
        try:
            self.client.upload_profile(profile)  # even when nothing fits: that is known now
        except ServiceUnavailableError as exc:
            outage: ServiceUnavailableError | None = exc
        else:
            outage = None
        if profile.max_micro_batch_size == 0:
            raise NothingFitsError(nothing_fits_advice(profile, self.workload))
        local = self._local_plan(profile)
        if outage is None:
            return self.ask(fallback=local)
        self.client.warn_once(
            ("upload", self.workload_key, self.device_key),
            f"{outage.message}; the profile measured here (M* = "
            f"{profile.max_micro_batch_size}) was not uploaded, so this run plans from it "
            "alone: the next run will measure again unless the service is back",
            TunerOfflineWarning,
            stacklevel=3,
        )
        return local.model_copy(update={"offline_reason": outage.message})

    def _local_plan(self, profile: Profile) -> OfflineRecommendation:
        """The plan from ``profile`` by the service's own rule: :func:`tuner.answer.decide`
        over this one profile, asked as the service would be."""
        answer = answer_from(
            profile,
            global_batch_size=self.global_batch_size,
            mesh=self.mesh,
            policy=self.policy,  # type: ignore[arg-type]
        )
        return OfflineRecommendation(
            **answer.model_dump(include=set(plans.Recommendation.model_fields)),
            workload=self.workload_key,
            device=self.device_key,
            offline_reason="",
        )

    def queue_and_wait(self, *, timeout: float, poll: float) -> plans.Recommendation:
        """Queue a profiling job for a worker on this device, wait, and ask again."""
        target = self.workload.target
        if target is None:
            raise BadInputError(
                "missing='queue' needs a workload a worker can import: load it with "
                "load_workload('package.module:function', options), or use missing='profile'"
            )
        job = self.client.queue_job(
            target,
            device=self.device_key,
            options=self.options,
            memory_limit_bytes=self.memory_limit_bytes,
            headroom=self.headroom,
            strategy=self.strategy,
            size_cap=self.size_cap,
            world_size=self.mesh.world_size if self.workload.parallel.distributed else None,
            parallel=self.workload.parallel.mode if self.workload.parallel.distributed else None,
            tp=self.mesh.tp if self.workload.parallel.has_mesh else None,
        )
        done = self.client.wait_for_job(job.id, timeout=timeout, poll=poll)
        if done.status == "failed":
            raise TunerError(
                f"profiling job {done.id} of {target} on {self.device_key} failed: {done.error}"
            )
        return self.ask()
