"""Files a workload reads because its options name them (``-o config=path``).

On a worker, a job's options come from anyone with a ``write`` token, and the files they
name are opened by the worker's user. So a worker restricts them: its owner's
``tuner worker --allow-path DIR --max-file-bytes SIZE`` reach every ``tuner profile`` it
runs, and under them a path option is read only when it is

- under an allowed directory as written (no ``..``) and once its symlinks are resolved;
- a regular file: not ``/dev/zero``, a FIFO, a socket or a device;
- at most ``max_bytes`` long.

A path outside the allowed directories is refused with one message, before the file system
is asked anything about it: the job's error, which every reader of the job sees, then says
nothing about whether the path exists. Without a restriction (``tuner profile`` run by a
user on their own files) a path is read as given.

Workloads read such files with :func:`read_option_file`; the command sets the restriction
around everything it loads with :func:`restricted`. Torch-free.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.units import format_bytes

# Configs are kilobytes; a few MiB leaves room for a large tokenizer-free config.
DEFAULT_MAX_FILE_BYTES = 4 * 2**20
# Read-only; never waits for a writer (a FIFO) nor follows a last-component symlink
# (checked already: this closes the window between the check and the open).
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


@dataclass(frozen=True)
class FilePolicy:
    """Where and how much a restricted workload may read (see the module docstring)."""

    directories: tuple[Path, ...]  # resolved: absolute, no symlinks
    max_bytes: int = DEFAULT_MAX_FILE_BYTES
    # The directories as their owner named them (absolute): a path given through the same
    # symlinked parent passes the lexical check too.
    named: tuple[Path, ...] = ()

    @classmethod
    def of(cls, directories: Iterable[str], *, max_bytes: int | None = None) -> FilePolicy:
        """The owner's ``--allow-path`` directories, resolved now; BadInputError for one
        that is not a directory (a typo would otherwise refuse every job)."""
        resolved, named = [], []
        for given in directories:
            real = Path(os.path.realpath(given))
            if not real.is_dir():
                raise BadInputError(
                    f"--allow-path {given!r} is not a directory: give the folder that holds "
                    "the files jobs may name, e.g. --allow-path /srv/model-configs"
                )
            resolved.append(real)
            named.append(Path(os.path.abspath(given)))
        limit = DEFAULT_MAX_FILE_BYTES if max_bytes is None else max_bytes
        return cls(tuple(resolved), limit, tuple(named))

    def _under(self, path: Path, *, lexically: bool = False) -> bool:
        directories = (*self.directories, *self.named) if lexically else self.directories
        return any(path == d or d in path.parents for d in directories)

    def read(self, given: str | os.PathLike[str], *, option: str, in_folder: str | None) -> bytes:
        """The bytes of ``given``, or WorkloadError that says why not (the same one for
        every path outside the allowed directories)."""
        text = os.fspath(given)
        refused = WorkloadError(
            f"option {option}={text!r} is not a file this worker may read: it reads only "
            "regular files under the directories its owner allows (tuner worker --allow-path DIR)"
        )
        # Lexical checks first: nothing below asks the file system about an outside path.
        if "\0" in text or ".." in Path(text).parts:
            raise refused
        if not self._under(Path(os.path.abspath(text)), lexically=True):
            raise refused
        real = Path(os.path.realpath(text))
        if in_folder is not None and real.is_dir():
            real = Path(os.path.realpath(real / in_folder))
        if not self._under(real):
            raise refused  # a symlink that leads out of the directories
        try:
            descriptor = os.open(real, _OPEN_FLAGS)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise WorkloadError(f"option {option}={text!r} cannot be read: {reason}") from None
        with os.fdopen(descriptor, "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise WorkloadError(f"option {option}={text!r} is not a regular file")
            # Read one byte past the limit: a file that grows after fstat is caught too.
            data = file.read(self.max_bytes + 1)
        if status.st_size > self.max_bytes or len(data) > self.max_bytes:
            raise WorkloadError(
                f"option {option}={text!r} is larger than the {format_bytes(self.max_bytes)} "
                "this worker reads (its --max-file-bytes)"
            )
        return data


_POLICY: ContextVar[FilePolicy | None] = ContextVar("option_file_policy", default=None)


@contextmanager
def restricted(policy: FilePolicy | None) -> Iterator[None]:
    """Within the block, :func:`read_option_file` reads under ``policy`` (None: freely)."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


def read_option_file(
    path: str | os.PathLike[str], *, option: str, in_folder: str | None = None
) -> bytes:
    """The file the option ``option`` names; with ``in_folder``, a folder stands for the
    file of that name in it (``config.json``). Under a restriction (see the module
    docstring) WorkloadError for a file the worker's owner did not allow."""
    policy = _POLICY.get()
    if policy is not None:
        return policy.read(path, option=option, in_folder=in_folder)
    chosen = Path(path)
    if in_folder is not None and chosen.is_dir():
        chosen = chosen / in_folder
    return chosen.read_bytes()
