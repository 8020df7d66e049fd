"""The client of the recommendation service. Torch-free, so it runs anywhere.

Configured by arguments or by the environment (``TUNER_URL``, ``TUNER_TOKEN``)::

    from tuner.client import TunerClient

    with TunerClient() as client:
        plan = client.recommend(workload="gpt", device="NVIDIA H100 80GB HBM3",
                                global_batch_size=512, world_size=8, fallback=(4, 16))
        print(plan.describe())

The URL chooses the store behind the same methods: ``http(s)://…`` is the service's REST
API; ``sqlite:///path`` (or ``postgresql://…``) runs the service's own store functions in
this process, with no server (it needs the ``server`` extra: ``pip install -e '.[server]'``
in a clone).

Answers are the wire contract's schemas (``tuner.core.wire``, pydantic only); errors are the
``tuner.core.errors`` type the service raised, with its message. The client never crashes
training for want of a service: requests time out and are retried a bounded number of
times, and when the service still cannot be reached, ``recommend`` answers with the last
answer it got to the same question (kept on disk) or the caller's fallback, with one
:class:`TunerOfflineWarning`.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, overload

from pydantic import Field, JsonValue, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from tuner.client.answer_cache import AnswerCache, Question, default_cache_dir
from tuner.client.store import open_store
from tuner.core import plan
from tuner.core.errors import BadInputError, ServiceUnavailableError, TunerError
from tuner.core.reports import ProfileReport
from tuner.core.results import Profile
from tuner.core.shape import MeshShape
from tuner.core.wire.common import API_PREFIX
from tuner.core.wire.jobs import JobPublic
from tuner.core.wire.oom_reports import OomReportPublic
from tuner.core.wire.profiles import ProfilePublic, ProfilesPublic
from tuner.core.wire.recommendation import RecommendationPublic as RecommendationPublic
from tuner.core.wire.recommendation import RecommendationQuery

FINISHED = ("succeeded", "failed")


class TunerClientWarning(UserWarning):
    """Something the client could not do, and went on without (never an exception, so
    training carries on)."""


class TunerOfflineWarning(TunerClientWarning):
    """The service could not be reached: an answer from the disk cache, or the caller's
    fallback, was used instead."""


class CachedRecommendation(RecommendationPublic):
    """The service's last answer to this very question, read from the disk cache because
    the service could not be reached. ``profile_age_s`` is the age now."""

    cached_at: datetime = Field(description="when the service gave this answer")
    offline_reason: str = Field(description="why the service could not be asked")


class OfflineRecommendation(plan.Recommendation):
    """Settings the service did not give: the caller's fallback, or a plan computed in
    this process from a profile measured here, used because the service could not be
    reached. ``workload`` and ``device`` are the question's (keys or names)."""

    workload: str
    device: str
    offline_reason: str


Fallback = tuple[int, int] | plan.Recommendation
"""``(micro_batch_size, grad_accum)``, or a whole recommendation for the same batch."""


class ClientSettings(BaseSettings):
    """Where the service is and how to reach it: ``TUNER_URL``, ``TUNER_TOKEN``,
    ``TUNER_TIMEOUT``, ``TUNER_RETRIES``, ``TUNER_CACHE_DIR``, ``TUNER_PROJECT``."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    url: str | None = None
    token: str | None = None
    timeout: float = Field(default=10.0, gt=0, description="seconds for each request")
    retries: int = Field(default=3, ge=0, description="retries of a request that may succeed")
    cache_dir: Path | None = Field(
        default=None, description="where answers are kept for offline use"
    )
    project: str | None = Field(
        default=None,
        description="the project questions are asked in, when a question names none",
    )


class TunerClient:
    """One service (or database), with the offline cache of its answers.

    Arguments left out come from :class:`ClientSettings`. ``retries`` bounds how often a
    request that may succeed later (no connection, a timeout, 502/503/504) is sent again,
    waiting ``backoff × 2^attempt`` seconds between tries; only requests that are harmless
    to repeat are (reads, profile uploads, and writes with an idempotency key, which every
    write this client sends carries).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        backoff: float = 0.2,
        cache_dir: Path | str | None = None,
    ) -> None:
        settings = ClientSettings()
        url = url or settings.url
        if not url:
            raise BadInputError(
                "no service URL: pass url=... or set TUNER_URL, e.g. http://127.0.0.1:8000 "
                "(or sqlite:///path/to/tuner.db to use a database without a server)"
            )
        self._store = open_store(
            url,
            token=token or settings.token,
            timeout=timeout if timeout is not None else settings.timeout,
            retries=retries if retries is not None else settings.retries,
            backoff=backoff,
        )
        self.url = self._store.url
        # The project a question names none of is asked in (TUNER_PROJECT, which the
        # transport and the embedded store also read when opened): put on the question,
        # so that it is part of its cache key.
        self._project = settings.project or None
        directory = cache_dir if cache_dir is not None else settings.cache_dir
        self._cache = AnswerCache(Path(directory) if directory else default_cache_dir())
        self._warned: set[object] = set()

    @property
    def cache_dir(self) -> Path:
        """Where answers are kept for when the service cannot be reached."""
        return self._cache.directory

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> TunerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def warn_once(
        self, key: object, message: str, category: type[Warning], *, stacklevel: int = 2
    ) -> None:
        """Warn about ``key`` the first time only: training that asks the same thing again
        and again hears about it once. ``stacklevel`` counts from the caller."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, category, stacklevel=stacklevel + 1)

    # Recommendations

    @overload
    def recommend(
        self,
        *,
        workload: str,
        device: str,
        global_batch_size: int,
        world_size: int = 1,
        parallel: str | None = None,
        policy: str = plan.DEFAULT_POLICY,
        seq_len: int | None = None,
        tokens_per_micro_batch: int | None = None,
        tp: int = 1,
        fallback: None = None,
    ) -> RecommendationPublic: ...

    @overload
    def recommend(
        self,
        *,
        workload: str,
        device: str,
        global_batch_size: int,
        world_size: int = 1,
        parallel: str | None = None,
        policy: str = plan.DEFAULT_POLICY,
        seq_len: int | None = None,
        tokens_per_micro_batch: int | None = None,
        tp: int = 1,
        fallback: Fallback,
    ) -> plan.Recommendation: ...

    def recommend(
        self,
        *,
        workload: str,
        device: str,
        global_batch_size: int,
        world_size: int = 1,
        parallel: str | None = None,
        policy: str = plan.DEFAULT_POLICY,
        seq_len: int | None = None,
        tokens_per_micro_batch: int | None = None,
        tp: int = 1,
        fallback: Fallback | None = None,
    ) -> plan.Recommendation:
        """Micro batch and accumulation steps for ``workload`` (key or name) on ``device``.

        global batch = micro batch × accumulation steps × world size / tp

        ``tp`` is the tensor-parallel degree of a 2-D FSDP mesh (``world_size / tp × tp``;
        1 without one): answered from the profile at that mesh shape, else ``estimated``
        across the shapes measured, or refused where that would extrapolate.

        ``parallel`` (``none``, ``ddp``, ``fsdp``; default the workload's own mode) is how
        the run spreads over its ``world_size`` ranks: a DDP or FSDP run is answered from
        profiles measured that way, at that world size or estimated across others; from a
        one-process profile only with ``one_process_only`` set and a ``caveat``.

        ``seq_len`` asks for sequences of that many tokens: measured where the workload's
        length family profiled it, else ``estimated`` from the fit across its measured
        lengths (from half the shortest to 1.25 times the longest); the answer gives
        ``tokens_per_micro_batch`` too. For packed sequences, ``tokens_per_micro_batch`` (a
        multiple of ``seq_len``) is the collator's budget: no micro batch exceeds it, and a
        budget that does not fit is refused with the one that does.

        When the service cannot be reached (after the retries), the answer is the last one
        it gave to this question, as a :class:`CachedRecommendation`; else ``fallback``,
        ``(micro_batch_size, grad_accum)`` or a recommendation, as an
        :class:`OfflineRecommendation`; either with one :class:`TunerOfflineWarning` per
        question. With neither, the ``ServiceUnavailableError`` is raised. Answers from the
        service (no profile, bad input, no access) are raised as they are, never masked.
        """
        query = RecommendationQuery.read(
            {
                "workload": workload,
                "device": device,
                "global_batch_size": global_batch_size,
                "world_size": world_size,
                "tp": tp,
                "parallel": parallel,
                "policy": policy,
                "seq_len": seq_len,
                "tokens_per_micro_batch": tokens_per_micro_batch,
            }
        )
        return self._ask(query, fallback)

    @overload
    def ask(self, query: RecommendationQuery, *, fallback: None = None) -> RecommendationPublic: ...

    @overload
    def ask(self, query: RecommendationQuery, *, fallback: Fallback) -> plan.Recommendation: ...

    def ask(
        self, query: RecommendationQuery, *, fallback: Fallback | None = None
    ) -> plan.Recommendation:
        """The answer to the wire question itself (``RecommendationQuery``: workload,
        device, global batch, mesh, parallel mode, policy, length, project), the one object
        every surface builds; :meth:`recommend` builds it from keywords. A question that
        names no project is asked in the client's (``TUNER_PROJECT``); its offline cache
        key is the whole question, the project included."""
        return self._ask(query, fallback)

    def _ask(self, query: RecommendationQuery, fallback: Fallback | None) -> plan.Recommendation:
        if query.project is None and self._project is not None:
            query = query.model_copy(update={"project": self._project})
        question = Question(self.url, query)
        # Checked now, not when first needed: a wrong fallback must not wait for an outage.
        backup = None if fallback is None else _fallback_answer(fallback, query)
        try:
            answer = self._store.recommend(query)
        except ServiceUnavailableError as exc:
            return self._offline_answer(question, exc, backup)
        try:
            self._cache.save(question, answer)
        except OSError as exc:
            self.warn_once(
                "cache",
                f"cannot keep answers for offline use in {self._cache.directory} ({exc}): "
                "set TUNER_CACHE_DIR (or cache_dir=) to a writable directory",
                TunerClientWarning,
                stacklevel=3,
            )
        return answer

    def _offline_answer(
        self,
        question: Question,
        error: ServiceUnavailableError,
        backup: OfflineRecommendation | None,
    ) -> plan.Recommendation:
        cached = self._cache.load(question)
        if cached is not None:
            self.warn_once(
                question.digest(),
                f"{error.message}; using its answer of "
                f"{cached.saved_at.isoformat(timespec='seconds')} from the offline cache for "
                f"{question.describe()}: micro batch {cached.answer.micro_batch_size}",
                TunerOfflineWarning,
                stacklevel=4,
            )
            age = max(0.0, (datetime.now(UTC) - cached.answer.profile_created_at).total_seconds())
            return CachedRecommendation(
                **{**cached.answer.model_dump(), "profile_age_s": age},
                cached_at=cached.saved_at,
                offline_reason=error.message,
            )
        if backup is not None:
            self.warn_once(
                question.digest(),
                f"{error.message}; no answer for {question.describe()} is cached, so the "
                f"fallback is used: micro batch {backup.micro_batch_size}",
                TunerOfflineWarning,
                stacklevel=4,
            )
            return backup.model_copy(update={"offline_reason": error.message})
        raise ServiceUnavailableError(
            f"{error.message}; no answer for {question.describe()} is cached in "
            f"{self._cache.directory}: pass fallback=(micro_batch_size, grad_accum) to train "
            "without the service"
        ) from error

    # Profiles

    def upload_profile(self, profile: Profile | Mapping[str, Any]) -> ProfilePublic:
        """Store ``profile``; sending the same one again returns the stored copy.

        ``profile`` is a :class:`Profile`, or a document as ``tuner profile --json`` prints
        it (checked here first; what the command adds beside the profile is not stored).
        """
        if not isinstance(profile, Profile):
            profile = _printed_profile(profile)
        # Only the profile's own fields: the service drops the derived peak_bytes.
        return self._store.upload_profile(
            profile.model_dump(mode="json", include=set(Profile.model_fields))
        )

    def get_profile(self, profile_id: int) -> ProfilePublic:
        """One stored profile with its probes."""
        return self._store.get_profile(profile_id)

    def list_profiles(
        self,
        *,
        workload: str | None = None,
        device: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int | None = None,
        page_token: str | None = None,
    ) -> ProfilesPublic:
        """One page of profiles, newest first; pass ``next_page_token`` on for the next."""
        params = {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in (
                ("workload", workload),
                ("device", device),
                ("created_after", created_after),
                ("created_before", created_before),
                ("limit", limit),
                ("next_page_token", page_token),
            )
            if value is not None
        }
        return self._store.list_profiles(params)

    # Training-time reports

    def report_oom(
        self,
        *,
        workload: str,
        device: str,
        micro_batch_size: int,
        settled_micro_batch_size: int | None = None,
        message: str | None = None,
        idempotency_key: str | None = None,
        profile_id: int | None = None,
    ) -> OomReportPublic:
        """Tell the service that training ran out of memory at ``micro_batch_size`` (and
        went on at ``settled_micro_batch_size``): its recommendations for the pair stay
        below the one and at or below the other until a newer profile exists.

        Give one ``idempotency_key`` per event (a UUID): the same event reported twice is
        then stored once. :class:`OomReporter` does. Without one this call makes its own,
        so that its retries are stored once. ``profile_id``, the recommendation's, attaches
        the report to the workload that profile measured, whatever a name means later.
        """
        body = {
            "workload": workload,
            "device": device,
            "micro_batch_size": micro_batch_size,
            "settled_micro_batch_size": settled_micro_batch_size,
            "message": message,
            "idempotency_key": idempotency_key or uuid.uuid4().hex,
            **({"profile_id": profile_id} if profile_id is not None else {}),
        }
        return self._store.report_oom(body)

    def oom_reporter(
        self,
        recommendation: plan.Recommendation | None = None,
        *,
        workload: str | None = None,
        device: str | None = None,
    ) -> OomReporter:
        """An ``on_oom`` callback for :class:`tuner.train.accumulate.Accumulator` that reports
        each out-of-memory to the service, for the workload and device ``recommendation``
        answered for (or those given)."""
        profile_id = None
        if recommendation is not None:
            if isinstance(recommendation, RecommendationPublic):
                workload, device = recommendation.workload_key, recommendation.device_key
                profile_id = recommendation.profile_id
            elif isinstance(recommendation, OfflineRecommendation):
                workload, device = recommendation.workload, recommendation.device
        if workload is None or device is None:
            raise BadInputError(
                "say what to report on: pass a recommendation this client returned, or "
                "workload=... and device=... (keys or names)"
            )
        return OomReporter(self, workload=workload, device=device, profile_id=profile_id)

    # Jobs

    def queue_job(
        self,
        target: str,
        *,
        device: str,
        options: Mapping[str, JsonValue] | None = None,
        memory_limit_bytes: int | str | None = None,
        headroom: float | None = None,
        strategy: str | None = None,
        size_cap: int | None = None,
        warmup_steps: int | None = None,
        world_size: int | None = None,
        parallel: str | None = None,
        tp: int | None = None,
        idempotency_key: str | None = None,
    ) -> JobPublic:
        """Queue ``tuner profile TARGET`` for a worker on ``device`` (its key or name).

        Settings left out take the worker's defaults, as ``tuner profile``'s flags do. With
        ``world_size`` and ``parallel`` (``ddp``, ``fsdp``) the job profiles on that many
        ranks, and only a worker with that many devices (CPU: processes) takes it; ``tp``
        lays them out as a ``(world_size / tp) × tp`` mesh (FSDP × tensor parallelism). A
        worker runs only the targets its owner allows (``tuner worker --allow``): any other
        fails at once, with the reason in the job's ``error``.

        The request carries an ``idempotency_key`` (this call's own, or the one given: a
        UUID per job), so a retry after a lost answer returns the job the first queued
        instead of queueing it twice.
        """
        settings = {
            name: value
            for name, value in (
                ("memory_limit_bytes", memory_limit_bytes),
                ("headroom", headroom),
                ("strategy", strategy),
                ("size_cap", size_cap),
                ("warmup_steps", warmup_steps),
                ("world_size", world_size),
                ("parallel", parallel),
                ("tp", tp),
            )
            if value is not None
        }
        body = {
            "target": target,
            "device": device,
            "options": dict(options or {}),
            "settings": settings,
            "idempotency_key": idempotency_key or uuid.uuid4().hex,
        }
        return self._store.queue_job(body)

    def get_job(self, job_id: int) -> JobPublic:
        """One job, with its status, attempts, error and (once done) its profile id."""
        return self._store.get_job(job_id)

    def wait_for_job(self, job_id: int, *, timeout: float = 3600.0, poll: float = 2.0) -> JobPublic:
        """The job once it has succeeded or failed, asking every ``poll`` seconds.

        Raises ``TimeoutError`` when it is still queued or running after ``timeout``
        seconds (it goes on; wait again, or look at it on the dashboard's Jobs page).
        """
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.status in FINISHED:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"job {job_id} is still {job.status} after {timeout:g} s (attempts: "
                    f"{job.attempts}): is a worker for device {job.device!r} running? "
                    "(`tuner worker`); wait again with wait_for_job"
                )
            time.sleep(min(poll, left))


class OomReporter:
    """``on_oom(failed_size, new_size, message)`` for :class:`tuner.train.accumulate.Accumulator`:
    reports each out-of-memory seen in training, with the size the run went on with, so
    that later recommendations for the pair stay at or below that size. The accumulator
    calls it on rank 0 only, and each report carries a fresh idempotency key, so one
    event is one stored report however often the request is retried.

    It never raises into training: a report that fails (no service, no access) is
    counted in ``failures`` and warned about once, with a :class:`TunerClientWarning`.
    """

    MESSAGE_CHARS = 2000

    def __init__(
        self, client: TunerClient, *, workload: str, device: str, profile_id: int | None = None
    ) -> None:
        self.client = client
        self.workload = workload
        self.device = device
        self.profile_id = profile_id
        self.reported: list[int] = []  # the failed sizes the service has recorded
        self.failures = 0

    def __call__(self, failed_size: int, new_size: int, message: str) -> None:
        try:
            self.client.report_oom(
                workload=self.workload,
                device=self.device,
                micro_batch_size=failed_size,
                settled_micro_batch_size=new_size if 0 < new_size < failed_size else None,
                message=message[: self.MESSAGE_CHARS] or None,
                # One key per event: the transport's retries send the same body again.
                idempotency_key=uuid.uuid4().hex,
                profile_id=self.profile_id,
            )
        except TunerError as exc:
            self.failures += 1
            category = (
                TunerOfflineWarning
                if isinstance(exc, ServiceUnavailableError)
                else TunerClientWarning
            )
            self.client.warn_once(
                ("oom", self.workload, self.device),
                f"could not report the out-of-memory at micro batch {failed_size} (training "
                f"goes on at {new_size}): {exc.message}; later recommendations for "
                f"{self.workload!r} on {self.device!r} will not know about it",
                category,
                stacklevel=3,
            )
        else:
            self.reported.append(failed_size)


def _printed_profile(document: Mapping[str, Any]) -> Profile:
    """A ``tuner profile --json`` document as the profile it holds, or what is wrong with it."""
    if not isinstance(document, Mapping):
        raise BadInputError(
            f"upload_profile takes a Profile or a dict as tuner profile --json prints it, "
            f"not {type(document).__name__}"
        )
    if "profiles" in document:
        raise BadInputError(
            "this is a tuner profile --seq-lens document: upload each of its 'profiles' "
            f"(or POST the whole document to {API_PREFIX}/profiles)"
        )
    try:
        return ProfileReport.model_validate(dict(document))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ())) or "the profile"
        raise BadInputError(
            f"not a profile as tuner profile --json prints it: {where}: {error['msg']}"
        ) from None


def _fallback_answer(fallback: Fallback, query: RecommendationQuery) -> OfflineRecommendation:
    """The caller's fallback as an answer to ``query``, checked against it."""
    per_rank = plan.per_rank_batch(query.global_batch_size, query.mesh)
    if isinstance(fallback, plan.Recommendation):
        asked = (query.global_batch_size, query.mesh)
        given = (fallback.global_batch_size, fallback.mesh)
        if given != asked:
            raise BadInputError(
                f"the fallback is for global batch {given[0]} over {_ranks(given[1])}, but "
                f"the question is for {asked[0]} over {_ranks(asked[1])}: give a fallback "
                "for this batch"
            )
        settings = fallback.model_dump(include=set(plan.Recommendation.model_fields))
    else:
        settings = _settings_of(fallback, query, per_rank)
    return OfflineRecommendation.model_validate(
        {
            **settings,
            "workload": query.workload,
            "device": query.device,
            "offline_reason": "",
        }
    )


def _ranks(mesh: MeshShape) -> str:
    return f"{mesh.world_size} ranks" + (f" as a {mesh.where()}" if mesh.is_mesh else "")


def _settings_of(
    fallback: tuple[int, int], query: RecommendationQuery, per_rank: int
) -> dict[str, Any]:
    """``(micro_batch_size, grad_accum)`` as a recommendation's fields."""
    micro, accum = fallback
    if micro < 1:
        raise BadInputError(f"fallback {fallback!r}: the micro batch size must be at least 1")
    expected = -(-per_rank // micro)  # ceil(B / dp / micro): the last micro batch may be smaller
    if accum != expected:
        raise BadInputError(
            f"fallback {fallback!r} does not give {per_rank} samples per rank and step: with "
            f"micro batch {micro}, grad_accum must be {expected} (global batch = micro batch "
            "× accumulation steps × data-parallel ranks; the last micro batch of a step may "
            "be smaller)"
        )
    micro = min(micro, per_rank)
    split = plan.split_runs(per_rank, micro)
    return {
        "micro_batch_size": micro,
        "grad_accum": sum(count for _, count in split),
        "split": split,
        "global_batch_size": query.global_batch_size,
        "world_size": query.mesh.world_size,
        "per_rank_batch_size": per_rank,
        "tp": query.mesh.tp,
        "policy": query.policy,
        "max_micro_batch_size": micro,
        "expected_peak_bytes": None,
        "expected_samples_per_second": None,
        "basis": "estimated",  # the caller's numbers, not measured
        "reason": f"the caller's fallback: micro batch {micro}, the remainder last",
    }
