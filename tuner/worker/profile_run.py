"""One job's ``tuner profile`` run in a subprocess, and what its exit status says.

A subprocess, so that a workload that crashes, hangs or exhausts the host's memory takes
down only itself. Output goes to files, not pipes: a chatty workload can never block on a
full pipe, and nobody has to read while waiting. Torch-free.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from tuner.core.errors import BadInputError
from tuner.core.option_files import FilePolicy
from tuner.core.reports import ProfileReport
from tuner.core.results import Profile
from tuner.worker.parent_death import die_with_parent

EXIT_MEANINGS = {
    1: "the workload raised an error that is not an out-of-memory",
    2: "the job's target, options or settings are unusable here",
}
STDERR_TAIL_LINES = 30
STDERR_TAIL_BYTES = 8192
# The most a failure's reason may say: the job's error, which every reader sees.
REASON_MAX_CHARS = 12_000
REDACTED = "[redacted]"

# What a profile subprocess inherits from the worker: these variables and prefixes only
# (an allow-list, so a credential the worker's owner sets under a new name is never
# passed on). Nothing under TUNER_: the worker's token and service address stay with it.
PASSED_VARIABLES = frozenset(
    {
        # The process and its interpreter.
        *("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ"),
        *("TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME", "LD_LIBRARY_PATH"),
        *("PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"),
        *("PYTHONWARNINGS", "VIRTUAL_ENV", "CONDA_PREFIX"),
        # Where model hubs keep their caches, and whether they may go online.
        *("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE"),
        *("HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TORCH_HOME"),
    }
)
PASSED_PREFIXES = (
    "LC_",
    # What the device, the collectives and the kernels do (PYTORCH_CUDA_ALLOC_CONF moves
    # the peak itself: the protocol pins it).
    *("CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "PYTORCH_", "TORCHINDUCTOR_", "TRITON_"),
    *("OMP_", "MKL_", "KMP_", "OPENBLAS_"),
    # A measured test run measures the profile subprocess too.
    "COVERAGE_",
)
# An ended profile gets this long to exit on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 5.0
WAIT_STEP_S = 0.2

# `tuner profile` flag for each job setting.
SETTING_FLAGS = {
    "memory_limit_bytes": "--memory-limit",
    "headroom": "--headroom",
    "strategy": "--strategy",
    "size_cap": "--max",
    "warmup_steps": "--warmup-steps",
    "world_size": "--world-size",
    "parallel": "--parallel",
    "tp": "--tp",
}


def profile_command(
    target: str,
    *,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    device: str,
    memory_limit_bytes: int | None,
    files: FilePolicy | None = None,
) -> list[str]:
    """The ``tuner profile`` command line for a job on ``device``.

    ``python -m`` puts the working directory first on ``sys.path``, as for the user's own
    ``tuner profile``. A job's memory limit, never above the worker's (the worker refuses
    the job otherwise: :mod:`tuner.worker.ceilings`), replaces the worker's. With ``files``
    the profile reads only the files it allows (:mod:`tuner.core.option_files`).
    """
    chosen = dict(settings)
    if chosen.get("memory_limit_bytes") is None and memory_limit_bytes is not None:
        chosen["memory_limit_bytes"] = memory_limit_bytes
    command = [sys.executable, "-m", "tuner.cli", "profile", target, "--json"]
    command += ["--device", device]
    if files is not None:
        for directory in files.named or files.directories:
            command += ["--allow-path", str(directory)]
        command += ["--max-file-bytes", str(files.max_bytes)]
    for name, flag in SETTING_FLAGS.items():
        value = chosen.get(name)
        if value is not None:
            command += [flag, str(value)]
    for name, value in options.items():
        # `tuner profile` reads option values as JSON, so strings keep their quotes.
        command += ["-o", f"{name}={json.dumps(value)}"]
    return command


def profile_environment(environ: Mapping[str, str], *, also: Iterable[str] = ()) -> dict[str, str]:
    """The variables of ``environ`` a profile subprocess gets: ``PASSED_VARIABLES``, those
    under ``PASSED_PREFIXES``, and the names in ``also`` (the owner's ``--pass-env``)."""
    extra = frozenset(also)
    return {
        name: value
        for name, value in environ.items()
        if name in PASSED_VARIABLES or name in extra or name.startswith(PASSED_PREFIXES)
    }


def passable_names(names: Iterable[str]) -> tuple[str, ...]:
    """The owner's ``--pass-env`` names (comma-separated items split); BadInputError for a
    name that is not a variable's, or one of the worker's own ``TUNER_*`` settings."""
    items = tuple(n.strip() for text in names for n in text.split(",") if n.strip())
    for name in items:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name.upper().startswith("TUNER_"):
            raise BadInputError(
                f"--pass-env {name!r} must name an environment variable outside TUNER_*, "
                "e.g. --pass-env HF_TOKEN: the worker's own settings never reach a job"
            )
    return items


def public_reason(reason: str, *, secrets: Iterable[str | None] = ()) -> str:
    """``reason`` as the job's readers may see it: every secret replaced by ``[redacted]``,
    and at most ``REASON_MAX_CHARS`` long (the first line, which says what happened, and
    the end, where a traceback names the error; the middle is cut)."""
    for secret in secrets:
        if secret:
            reason = reason.replace(secret, REDACTED)
    if len(reason) <= REASON_MAX_CHARS:
        return reason
    head = reason.splitlines()[0][: REASON_MAX_CHARS // 4]
    tail = reason[-(REASON_MAX_CHARS // 2) :]
    cut = len(reason) - len(head) - len(tail)
    return f"{head}\n[... {cut} characters cut ...]\n{tail}"


@dataclass(frozen=True)
class Run:
    """A finished subprocess: ``returncode`` is None when it was ended (timed out or
    cancelled) rather than exiting by itself."""

    returncode: int | None
    stdout: str
    stderr_tail: str
    cancelled: bool = False


def run_profile(
    command: list[str],
    *,
    timeout: float,
    cancelled: Callable[[], bool],
    env: Mapping[str, str] | None = None,
) -> Run:
    """Run ``command`` until it exits, ``timeout`` seconds pass, or ``cancelled()`` turns
    true (asked every fraction of a second); in the last two cases the process is ended.
    ``env`` is its whole environment (None: this process's).

    The subprocess stays in the caller's process group: whatever kills the worker's group
    (a terminal's Ctrl-C, a supervisor) kills the profile too, and leaves no orphan; and on
    Linux it gets SIGKILL when the worker dies alone (:mod:`tuner.worker.parent_death`).
    """
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            command, stdout=stdout, stderr=stderr, env=env, preexec_fn=die_with_parent()
        )
        deadline = time.monotonic() + timeout
        returncode: int | None = None
        stopped = False
        while True:
            try:
                returncode = process.wait(timeout=WAIT_STEP_S)
                break
            except subprocess.TimeoutExpired:
                pass
            stopped = cancelled()
            if stopped or time.monotonic() > deadline:
                _end(process)
                break
        stdout.seek(0)
        return Run(
            returncode=returncode,
            stdout=stdout.read().decode(errors="replace"),
            stderr_tail=tail_of(stderr),
            cancelled=stopped,
        )


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a grace period; wait for the process either way."""
    process.terminate()
    try:
        process.wait(timeout=TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def tail_of(stream: IO[bytes]) -> str:
    """The last lines of a captured stream, bounded in size."""
    stream.seek(0, os.SEEK_END)
    size = stream.tell()
    stream.seek(max(0, size - STDERR_TAIL_BYTES))
    text = stream.read().decode(errors="replace")
    return "\n".join(text.strip().splitlines()[-STDERR_TAIL_LINES:])


def profile_from_output(stdout: str) -> Profile:
    """The profile ``tuner profile --json`` printed: its last line that is a JSON object.

    Earlier lines may be the workload's own prints. What the command adds beside the
    profile (the plan, the stored id, the advice) is checked and left out.
    """
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ValueError("tuner profile printed no JSON profile on stdout")
    return ProfileReport.model_validate_json(lines[-1]).profile()


@dataclass(frozen=True)
class Outcome:
    """What became of one job run: a profile, or a failure and whether to retry it."""

    profile: Profile | None = None
    reason: str | None = None
    retryable: bool = False


def outcome_of(run: Run, *, timeout: float) -> Outcome:
    """Judge a run that was not cancelled (``returncode`` None: it timed out)."""
    returncode = run.returncode
    tail = f"\n{run.stderr_tail}" if run.stderr_tail else ""
    if returncode is None:
        return Outcome(
            reason=f"tuner profile did not finish within {timeout:g} s and was killed "
            f"(a hang, or a job too big for --job-timeout){tail}",
            retryable=True,
        )
    if returncode in (0, 3):
        try:
            return Outcome(profile=profile_from_output(run.stdout))
        except ValueError as exc:
            return Outcome(reason=f"tuner profile exited {returncode} but {exc}{tail}")
    if returncode in EXIT_MEANINGS:
        return Outcome(
            reason=f"tuner profile exited {returncode}: {EXIT_MEANINGS[returncode]}{tail}"
        )
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return Outcome(
            reason=f"tuner profile was killed by {name} (a crash in native code, or the "
            f"kernel's out-of-memory killer){tail}",
            retryable=True,
        )
    return Outcome(
        reason=f"tuner profile exited {returncode}, a status it never uses: the process "
        f"crashed or the workload exited it{tail}",
        retryable=True,
    )
