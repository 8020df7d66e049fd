"""``tuner worker``: run profiling jobs from the service on this host's device."""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import datetime
from types import FrameType
from typing import Any

from rich.console import Console

from tuner.core.commands import EXIT_OK, memory, positive_int
from tuner.core.errors import BadInputError


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be a positive number of seconds")
    return value


def add_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="claim and run profiling jobs for this host's device",
        description="Register this host's device with the service, then claim profiling "
        "jobs queued for it (by device key or device name), run each in its own "
        "`tuner profile` subprocess, and upload the profile. Stop with SIGTERM or Ctrl-C: "
        "the running job goes back to the queue.",
    )
    worker.add_argument(
        "--url", default=None, help="the service, e.g. http://tuner:8000 (TUNER_URL)"
    )
    worker.add_argument(
        "--token",
        default=None,
        help="a token with the worker scope (TUNER_TOKEN, which keeps it out of `ps`)",
    )
    worker.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present, else cpu)"
    )
    worker.add_argument(
        "--memory-limit",
        type=memory,
        default=None,
        help="memory to fit in, e.g. 2GiB: needed on cpu; on cuda it emulates a smaller card. "
        "A job may ask for less, never more (refused)",
    )
    worker.add_argument("--name", default=None, help="shown in the service (default: host name)")
    worker.add_argument(
        "--allow",
        action="append",
        default=None,
        metavar="PATTERN",
        help="workload targets this worker may run, repeatable (TUNER_WORKER_ALLOW, "
        "comma-separated): a module prefix (examples: examples.gpt, not examples_evil), a "
        "glob on the module ('mypkg.*'), or with a colon on the whole target "
        "(examples.gpt:workload). Jobs for anything else fail unrun; '*' lets any write "
        "token run any code here. Required",
    )
    worker.add_argument(
        "--pass-env",
        action="append",
        default=None,
        metavar="NAME",
        help="an environment variable a job's profile may read, repeatable "
        "(TUNER_WORKER_PASS_ENV, comma-separated), e.g. HF_TOKEN for gated models. A job "
        "gets only the path, locale, Python, CUDA, NCCL, PyTorch and thread variables "
        "otherwise, never TUNER_*",
    )
    worker.add_argument(
        "--max-warmup-steps",
        type=positive_int,
        default=None,
        help="the most warm-up steps a job may ask for (TUNER_MAX_WARMUP_STEPS; default 10); "
        "a job asking more fails with the reason",
    )
    worker.add_argument(
        "--max-size-cap",
        type=positive_int,
        default=None,
        help="the largest size cap (micro batch size to try) a job may ask for "
        "(TUNER_MAX_SIZE_CAP; default 4096); a job asking more fails with the reason",
    )
    worker.add_argument(
        "--allow-path",
        action="append",
        default=None,
        metavar="DIR",
        help="a directory whose files a job's path options may name (-o config=...), "
        "repeatable (TUNER_WORKER_ALLOW_PATH, separated by ':'); only regular files under "
        "it are read. Default: none, so no job reads a file",
    )
    worker.add_argument(
        "--max-file-bytes",
        type=memory,
        default=None,
        help="the largest file a job's option may name (TUNER_MAX_FILE_BYTES; default 4MiB)",
    )
    worker.add_argument(
        "--ranks",
        type=positive_int,
        default=None,
        help="largest world size a job may profile on (TUNER_RANKS; default: the GPUs on "
        "cuda, the CPU cores on cpu); jobs that need more stay queued for another worker",
    )
    worker.add_argument(
        "--poll-interval",
        type=seconds,
        default=None,
        help="seconds between claims while the queue is empty (default 2)",
    )
    worker.add_argument(
        "--job-timeout",
        type=seconds,
        default=None,
        help="seconds a profile may run before it is killed and retried (default 3600)",
    )
    worker.add_argument("--once", action="store_true", help="run one job, then exit")
    worker.add_argument(
        "--exit-when-idle",
        action="store_true",
        help="exit when the queue has no job for this device",
    )


def run(args: argparse.Namespace, stderr: Console) -> int:
    from tuner.core.option_files import FilePolicy
    from tuner.worker.allow import AllowList
    from tuner.worker.ceilings import Ceilings
    from tuner.worker.loop import Worker, WorkerSettings, describe_device
    from tuner.worker.profile_run import passable_names

    settings = WorkerSettings()
    url = args.url or settings.url
    if not url:
        raise BadInputError("give the service's address with --url or TUNER_URL")

    def log(message: str) -> None:
        stamp = datetime.now().astimezone().strftime("%H:%M:%S")
        stderr.print(f"{stamp} {message}", highlight=False, markup=False, soft_wrap=True)

    allow = AllowList.parse(args.allow or settings.allow)
    if not allow.patterns:
        raise BadInputError(
            "say which workloads this worker may run: --allow PATTERN (or TUNER_WORKER_ALLOW), "
            "e.g. --allow examples or --allow mypkg.models; a job queued by any write token "
            "runs here as this user"
        )
    pass_env = passable_names(args.pass_env or settings.pass_env)
    memory_limit = args.memory_limit or settings.memory_limit
    files = FilePolicy.of(
        args.allow_path or settings.allow_path,
        max_bytes=args.max_file_bytes or settings.max_file_bytes,
    )
    identity = describe_device(args.device or settings.device, memory_limit)
    ceilings = Ceilings(
        memory_limit_bytes=memory_limit or identity.info.capacity_bytes,
        warmup_steps=args.max_warmup_steps or settings.max_warmup_steps,
        size_cap=args.max_size_cap or settings.max_size_cap,
    )
    worker = Worker(
        url=url,
        token=args.token or settings.token,
        identity=identity,
        name=args.name or settings.name,
        allow=allow,
        pass_env=pass_env,
        memory_limit_bytes=memory_limit,
        ceilings=ceilings,
        files=files,
        poll_interval=args.poll_interval or settings.poll_interval,
        job_timeout=args.job_timeout or settings.job_timeout,
        ranks=args.ranks or settings.ranks,
        log=log,
    )

    def on_signal(number: int, _frame: FrameType | None) -> None:
        log(f"{signal.Signals(number).name}: finishing; send it again to quit at once")
        worker.stop()
        # A second signal takes the default action: the process ends there and then.
        signal.signal(number, signal.SIG_DFL)

    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, on_signal)
    try:
        done = worker.run(max_jobs=1 if args.once else None, exit_when_idle=args.exit_when_idle)
        worker.leave()  # not on an exception: a worker that crashed did not stop on purpose
    finally:
        worker.close()
    log(f"worker {worker.worker_id} stops after {done} job run(s)")
    return EXIT_OK
