"""The job worker: registers this host's device, claims profiling jobs for it under a
lease, runs each in its own ``tuner profile`` subprocess, and reports the outcome.

The worker process itself never imports torch and never touches the GPU: the device is
described by a short-lived subprocess, and every job runs in a fresh one. So a workload
that crashes, hangs or runs the host out of memory takes down only its subprocess, and
the worker's own CUDA context never counts as "memory outside torch" in a measurement.

While a job runs, a thread heartbeats its lease. The outcome is uploaded under the same
lease: a profile (``tuner profile`` exit 0, or 3 when nothing fits), a failure that is
not retried (exit 1: the workload raised; exit 2: bad input), or a retryable failure (a
crash, a signal, a timeout, the worker being stopped). When the service answers that the
lease is gone, the job belongs to someone else and the worker drops it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tuner.client.store import JobClaim, JobPublic, Lease, Store, open_store
from tuner.core.errors import (
    BadInputError,
    ConflictError,
    NotFoundError,
    ServiceUnavailableError,
    TunerError,
)
from tuner.core.option_files import DEFAULT_MAX_FILE_BYTES, FilePolicy
from tuner.core.results import DeviceInfo, Profile
from tuner.core.units import parse_bytes
from tuner.worker.allow import AllowList
from tuner.worker.ceilings import DEFAULT_MAX_SIZE_CAP, DEFAULT_MAX_WARMUP_STEPS, Ceilings
from tuner.worker.profile_run import (
    Outcome,
    outcome_of,
    profile_command,
    profile_environment,
    public_reason,
    run_profile,
)

Log = Callable[[str], None]


def _optional_bytes(value: Any) -> Any:
    return parse_bytes(value) if isinstance(value, str) else value


def _comma_separated(value: Any) -> Any:
    return value.split(",") if isinstance(value, str) else value


def _path_list(value: Any) -> Any:
    # Paths may hold commas; lists of them are separated as PATH is.
    return [p for p in value.split(os.pathsep) if p] if isinstance(value, str) else value


class WorkerSettings(BaseSettings):
    """The worker's settings from the environment (``TUNER_URL``, ``TUNER_TOKEN``, ...);
    command-line flags override them."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    url: str | None = None
    token: str | None = None
    name: str = Field(default_factory=socket.gethostname)
    device: str | None = None
    memory_limit: Annotated[int | None, BeforeValidator(_optional_bytes)] = None
    ranks: int | None = Field(
        default=None,
        ge=1,
        description="ranks a job may profile on (DDP/FSDP world size); default: the GPUs "
        "on cuda, the CPU cores on cpu",
    )
    poll_interval: float = Field(default=2.0, gt=0)
    job_timeout: float = Field(default=3600.0, gt=0)
    max_warmup_steps: int = Field(
        default=DEFAULT_MAX_WARMUP_STEPS, ge=1, description="the most warm-up steps a job gets"
    )
    max_size_cap: int = Field(
        default=DEFAULT_MAX_SIZE_CAP, ge=1, description="the largest size cap a job gets"
    )
    allow_path: Annotated[list[str], NoDecode, BeforeValidator(_path_list)] = Field(
        default_factory=list,
        validation_alias="TUNER_WORKER_ALLOW_PATH",
        description="directories whose files a job's path options may name (os.pathsep-separated)",
    )
    max_file_bytes: Annotated[int, BeforeValidator(_optional_bytes)] = Field(
        default=DEFAULT_MAX_FILE_BYTES, ge=1, description="the largest file a job's option names"
    )
    allow: Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)] = Field(
        default_factory=list,
        validation_alias="TUNER_WORKER_ALLOW",
        description="the workload targets this worker runs (tuner.worker.allow), comma-separated",
    )
    pass_env: Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)] = Field(
        default_factory=list,
        validation_alias="TUNER_WORKER_PASS_ENV",
        description="more variables a job's profile subprocess inherits, comma-separated",
    )


# The device, described in a subprocess


@dataclass(frozen=True)
class DeviceIdentity:
    """What the worker registers: the device it runs profiles on, its key and details."""

    device: str
    key: str
    info: DeviceInfo
    ranks: int = 1  # devices of this kind on the host (processes on a CPU)


# Importing torch and initialising CUDA takes seconds; minutes means a stuck driver.
DESCRIBE_TIMEOUT_S = 300.0
_DESCRIBE = (
    "import sys; from tuner.worker.loop import describe_main; sys.exit(describe_main(sys.argv[1:]))"
)


def describe_device(device: str | None, memory_limit_bytes: int | None) -> DeviceIdentity:
    """Describe ``device`` (default: cuda when present, else cpu) in a subprocess."""
    argv = [sys.executable, "-c", _DESCRIBE, device or "", str(memory_limit_bytes or "")]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=DESCRIBE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise BadInputError(
            f"describing device {device or '(default)'} took over {DESCRIBE_TIMEOUT_S:g} s: "
            "check that the driver answers (nvidia-smi)"
        ) from None
    if done.returncode != 0:
        message = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise BadInputError(f"cannot use device {device or '(default)'}: {message[0]}")
    document = json.loads(done.stdout.strip().splitlines()[-1])
    return DeviceIdentity(
        device=document["device"],
        key=document["key"],
        info=DeviceInfo.model_validate(document["info"]),
        ranks=int(document.get("ranks", 1)),
    )


def describe_main(argv: list[str]) -> int:
    """The subprocess side of :func:`describe_device`: print the device as JSON."""
    import torch

    from tuner.engine.backends import make_backend
    from tuner.engine.fingerprint import device_key

    requested, limit = argv
    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        backend = make_backend(device, memory_limit_bytes=int(limit) if limit else None)
    except TunerError as exc:
        print(exc.message, file=sys.stderr)
        return 2
    document = {
        "device": device,
        "key": device_key(backend),
        "info": backend.describe().model_dump(mode="json"),
        # One rank per GPU under NCCL; on a CPU a rank is a process, one per core.
        "ranks": torch.cuda.device_count() if backend.kind == "cuda" else os.cpu_count() or 1,
    }
    print(json.dumps(document))
    return 0


# The lease keeper


class LeaseKeeper:
    """Heartbeats one job's lease from a thread until stopped or the lease is lost."""

    def __init__(self, store: Store, job_id: int, lease: Lease, log: Log) -> None:
        self._store = store
        self._job_id = job_id
        self._body = {"lease_id": lease.lease_id}
        self._seconds = lease.lease_seconds
        self._interval = max(0.1, lease.lease_seconds / 3)
        self._log = log
        self._done = threading.Event()
        self.lost = threading.Event()
        # Monotonic time until which the lease is surely held (as of the last extension).
        self.valid_until = time.monotonic() + lease.lease_seconds
        self._thread = threading.Thread(target=self._beat, name=f"lease-{job_id}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def held(self) -> bool:
        return not self.lost.is_set() and time.monotonic() < self.valid_until

    def _beat(self) -> None:
        while not self._done.wait(self._interval):
            sent = time.monotonic()
            try:
                self._store.extend_lease(self._job_id, self._body)
            except ConflictError as exc:
                self._log(f"job {self._job_id}: lost the lease: {exc.message}")
                self.lost.set()
                return
            except TunerError as exc:
                # The service may come back before the lease runs out; keep trying.
                self._log(f"job {self._job_id}: heartbeat failed, will retry: {exc.message}")
            else:
                self.valid_until = sent + self._seconds


# The worker


class Worker:
    """Claims and runs jobs until stopped. Nothing a job does can end the loop."""

    def __init__(
        self,
        *,
        url: str,
        token: str | None,
        identity: DeviceIdentity,
        name: str,
        allow: AllowList,
        pass_env: tuple[str, ...] = (),
        memory_limit_bytes: int | None = None,
        ceilings: Ceilings | None = None,
        files: FilePolicy | None = None,
        poll_interval: float = 2.0,
        job_timeout: float = 3600.0,
        ranks: int | None = None,
        log: Log,
    ) -> None:
        self._url, self._token = url, token
        self._store = _open(url, token)
        self.identity = identity
        self.name = name
        # What this worker may run: its owner's decision, never the job's.
        self.allow = allow
        self.pass_env = pass_env
        self.memory_limit_bytes = memory_limit_bytes
        # The most a job may ask for, and the files its options may name: the owner's too.
        # Unset: the worker's own limit (else the device's memory) and the defaults.
        self.ceilings = ceilings or Ceilings(
            memory_limit_bytes=memory_limit_bytes or identity.info.capacity_bytes
        )
        self.files = files or FilePolicy(())
        self.poll_interval = poll_interval
        self.job_timeout = job_timeout
        # Jobs that profile on more ranks than this stay queued for another worker.
        self.ranks = ranks or identity.ranks
        self.log = log
        self.worker_id: int | None = None
        self.jobs_done = 0
        self._stopping = threading.Event()

    def close(self) -> None:
        self._store.close()

    def leave(self) -> None:
        """Tell the service this worker stops on purpose, so that it is shown as gone,
        not silent. Best effort: a service that cannot be reached sees it go silent."""
        if self.worker_id is None:
            return
        try:
            self._store.leave_worker(self.worker_id)
        except TunerError as exc:
            self.log(f"could not say that it leaves: {exc.message}")

    def stop(self) -> None:
        """Claim nothing new; hand the running job back; return from :meth:`run`."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def register(self) -> int | None:
        """Register this worker and its device; wait out an unreachable service.

        Returns the worker's id, or None when stopped before the service answered."""
        body = {
            "name": self.name,
            "device_key": self.identity.key,
            "device": self.identity.info.model_dump(mode="json"),
            # One key for this registration and all its retries: registered once.
            "idempotency_key": uuid.uuid4().hex,
        }
        while True:
            try:
                reply = self._store.register_worker(body)
            except ServiceUnavailableError as exc:
                self.log(f"cannot register yet, retrying: {exc.message}")
                if self._stopping.wait(self.poll_interval):
                    return None
                continue
            self.worker_id = reply.id
            info = self.identity.info
            self.log(
                f"registered as worker {self.worker_id} on {info.name} "
                f"(device key {self.identity.key}, {self.identity.device}); takes jobs of up "
                f"to {self.ranks} rank{'s' if self.ranks != 1 else ''}"
            )
            return self.worker_id

    def run(self, *, max_jobs: int | None = None, exit_when_idle: bool = False) -> int:
        """Process jobs until stopped, ``max_jobs`` are done, or (``exit_when_idle``) the
        queue has nothing for this device. Returns the number of jobs processed."""
        if self.worker_id is None and self.register() is None:
            return self.jobs_done
        while not self.stopping and (max_jobs is None or self.jobs_done < max_jobs):
            try:
                claim = self._claim()
            except ServiceUnavailableError as exc:
                self.log(f"cannot claim, will retry: {exc.message}")
                self._stopping.wait(self.poll_interval)
                continue
            if claim is None:
                if exit_when_idle:
                    break
                self._stopping.wait(self.poll_interval)
                continue
            self._process(claim)
            self.jobs_done += 1
        return self.jobs_done

    def _claim(self) -> JobClaim | None:
        if self.worker_id is None:
            raise RuntimeError("claim before registration")  # run() registers first
        try:
            return self._store.claim_job(self.worker_id, ranks=self.ranks)
        except NotFoundError:
            self.log("the service no longer knows this worker; registering again")
            self.register()
            return None

    def _process(self, claim: JobClaim) -> None:
        job = claim.job
        allowed = self.allow.allows(job.target)
        if allowed:
            self.log(f"job {job.id}: profiling {job.target} (options {job.options or '{}'})")
        heartbeat = _open(self._url, self._token)  # its own connection, for its thread
        try:
            with LeaseKeeper(heartbeat, job.id, claim.lease, self.log) as keeper:
                # A refused target is never imported, a job over a ceiling never started:
                # it fails with the reason, for good (this worker will never run it; a job
                # nobody runs must not wait).
                refusal = (
                    self.ceilings.refusal(job.settings, worker=self.name)
                    if allowed
                    else self.allow.refusal(job.target, worker=self.name)
                )
                outcome = Outcome(reason=refusal) if refusal else self._run_profile(job, keeper)
                if outcome is not None:
                    self._report(job, claim.lease, outcome, keeper)
        finally:
            heartbeat.close()

    def _run_profile(self, job: JobPublic, keeper: LeaseKeeper) -> Outcome | None:
        """Run the job's profile in a subprocess; None when the lease was lost meanwhile."""
        command = profile_command(
            job.target,
            options=job.options,
            settings=job.settings.model_dump(mode="json"),
            device=self.identity.device,
            memory_limit_bytes=self.memory_limit_bytes,
            files=self.files,
        )
        try:
            run = run_profile(
                command,
                timeout=self.job_timeout,
                cancelled=lambda: keeper.lost.is_set() or self.stopping,
                # Nothing of the worker's credentials reaches the job's code.
                env=profile_environment(os.environ, also=self.pass_env),
            )
        except OSError as exc:
            return Outcome(reason=f"cannot start tuner profile on this host: {exc}", retryable=True)
        if keeper.lost.is_set():
            self.log(f"job {job.id}: dropped, its lease went to someone else")
            return None
        if self.stopping and run.returncode not in (0, 3):
            # Ended by the stop, or killed by the same Ctrl-C (it reaches the whole group).
            return Outcome(
                reason=f"worker {self.name!r} was stopped while the job ran; "
                "another worker can take it",
                retryable=True,
            )
        return outcome_of(run, timeout=self.job_timeout)

    def _report(self, job: JobPublic, lease: Lease, outcome: Outcome, keeper: LeaseKeeper) -> None:
        """Send the outcome under the lease, retrying while the lease may still be held."""
        try:
            if outcome.profile is not None:
                try:
                    self._send(job, keeper, "result", self._result_body(lease, outcome.profile))
                except BadInputError as exc:
                    # Retrying cannot make the service accept it; say why, once.
                    refused = f"the service refused the profile: {exc.message}"
                    outcome = Outcome(reason=refused, retryable=False)
                    self._send(job, keeper, "failure", self._failure_body(lease, outcome))
            else:
                self._send(job, keeper, "failure", self._failure_body(lease, outcome))
        except ConflictError as exc:
            if outcome.profile is not None and self._stored_already(job.id):
                self.log(f"job {job.id}: already recorded (a retry after a lost response)")
            else:
                self.log(f"job {job.id}: the service refused the outcome: {exc.message}")
            return
        except (NotFoundError, BadInputError) as exc:
            self.log(f"job {job.id}: the service refused the outcome: {exc.message}")
            return
        except ServiceUnavailableError as exc:
            self.log(f"job {job.id}: gave up reporting, its lease ran out: {exc.message}")
            return
        if outcome.profile is not None:
            self.log(f"job {job.id}: stored a profile, M* = {outcome.profile.max_micro_batch_size}")
        else:
            retry = "may be retried" if outcome.retryable else "not retried"
            first_line = (outcome.reason or "").splitlines()[0]
            self.log(f"job {job.id}: failed ({retry}): {first_line}")

    @staticmethod
    def _result_body(lease: Lease, profile: Profile) -> dict[str, Any]:
        # round_trip leaves out computed fields (peak_bytes), which are not input.
        document = profile.model_dump(mode="json", round_trip=True)
        return {"lease_id": lease.lease_id, "profile": document}

    def _failure_body(self, lease: Lease, outcome: Outcome) -> dict[str, Any]:
        reason = public_reason(
            outcome.reason or "the job failed without a reason", secrets=[self._token]
        )
        return {"lease_id": lease.lease_id, "reason": reason, "retryable": outcome.retryable}

    def _send(self, job: JobPublic, keeper: LeaseKeeper, what: str, body: dict[str, Any]) -> None:
        send = self._store.submit_result if what == "result" else self._store.report_failure
        while True:
            try:
                send(job.id, body)
                return
            except ServiceUnavailableError as exc:
                if not keeper.held:
                    raise
                self.log(f"job {job.id}: cannot report yet, retrying: {exc.message}")
                time.sleep(self.poll_interval)

    def _stored_already(self, job_id: int) -> bool:
        """Whether this worker's result for the job is stored: a retried upload whose first
        try got through but whose answer was lost is refused as a duplicate."""
        try:
            job = self._store.get_job(job_id)
        except TunerError:
            return False
        return job.status == "succeeded" and job.worker_id == self.worker_id


def _open(url: str, token: str | None) -> Store:
    """The service's store at ``url``, with the transport's usual timeouts and retries."""
    return open_store(url, token=token, timeout=10.0, retries=3, backoff=0.2)
