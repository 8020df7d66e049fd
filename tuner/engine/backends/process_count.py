"""The exact count: every CPU allocation and free of the process, on every thread.

A small native hook (``counting_allocator.cpp``) is put in front of torch's CPU allocator
(``c10::SetCPUAllocator`` at the highest priority). Every block torch hands out on the
CPU from then on is recorded with its size and the kind of thread that asked for it, and
taken off when it is freed, whichever thread frees it; live and peak bytes change under
one lock, so the peak is the most the process's torch allocations held at any instant:

    peak = max over allocations and frees e of  Σ_{e' ≤ e} size(e')   (frees negative)

One process's probes count with it alone: the measured step runs with no dispatch mode
(a mode changes what autograd allocates, :mod:`.cpu`), its limit enforced by the hook
(:meth:`ProcessAllocations.limited`), and what the workload held at a block's start read
from the blocks allocated since the prober took the workload (:meth:`live_since`).

Threads are told apart by a tag each sets on itself: the step's thread (:data:`STEP`),
the step's thread inside a collective operator (:data:`COLLECTIVE`, gloo's output-sized
buffer of ``_allgather_base_`` and ``reduce_scatter_tensor_coalesced_``, which NCCL does
not make), and every other thread (:data:`OTHER`, gloo's workers). Blocks allocated
before the hook was installed are not seen, nor are their frees: it is installed when a
CPU backend is made (on a rank before the workload is built, and the thread that makes it
is the step's from then on; in one process the weights made before it count as resident
tensors).

It is compiled once per machine and torch version with ``torch.utils.cpp_extension``
(a few seconds: plain C functions called through ctypes, no pybind11) into
torch's extension cache (``TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``), and loaded from there afterwards. Where it cannot be built
(no C++ compiler or no ninja), :func:`process_allocations` says so in one line and returns
``None``; the CPU backend then counts one process's steps with the operator tracker (a
dispatch mode: M* may be one below the training's, never above) and a rank's with
torch.profiler (:mod:`.allocations`), which is never below the process's count but may be
above it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OTHER, STEP, COLLECTIVE = 0, 1, 2
_TAGS = 3
_FIELDS = 3 + 3 * _TAGS  # live, peak, allocations; then each tag's live, peak, allocations
_SOURCE = Path(__file__).with_name("counting_allocator.cpp")
_NAME = "tuner_counting_allocator"

NO_EXACT_COUNT = (
    "the exact CPU allocation count could not be built ({reason}); counting with the "
    "operator tracker (a dispatch mode, under which autograd may make gradient copies "
    "training does not: M* may be one below) and torch.profiler (which may count gloo's "
    "copies above what the process held) instead: install a C++ compiler and ninja "
    "(e.g. apt-get install g++ && pip install ninja) for the exact count"
)


@dataclass(frozen=True)
class ThreadCount:
    """What blocks allocated by one kind of thread hold (whichever thread frees them)."""

    live_bytes: int
    peak_bytes: int
    allocations: int


@dataclass(frozen=True)
class ProcessCount:
    """One reading of the counter. Peaks are since the innermost open
    :meth:`ProcessAllocations.block` began (since the counter was installed outside one)."""

    live_bytes: int
    peak_bytes: int
    allocations: int
    other: ThreadCount
    step: ThreadCount
    collective: ThreadCount


@dataclass
class BlockCount:
    """Filled when a :meth:`ProcessAllocations.block` exits. ``peak_bytes``: the most the
    process held in the block, every thread, less what the step's thread had allocated
    before it (which the caller counts itself, as the tracker's live bytes at the start):

        peak = max over the block of live(t)  −  live of the step's thread's blocks at start

    so a collective's block from before that is still held when the block begins (gloo's
    worker lets go late) counts while it lives, and its free lowers nothing the caller
    counted. ``collective_peak_bytes`` and ``other_threads_peak_bytes``: the same for
    blocks the step's thread allocated inside collectives and for blocks other threads
    allocated; ``other_threads_allocations``: how many other threads made."""

    peak_bytes: int = 0
    collective_peak_bytes: int = 0
    other_threads_peak_bytes: int = 0
    other_threads_allocations: int = 0


class ProcessAllocations:
    """The installed counter (one per process)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._library = library
        self._buffer = (ctypes.c_int64 * _FIELDS)()
        self._lock = threading.Lock()  # the buffer is shared

    def read(self) -> ProcessCount:
        with self._lock:
            self._library.tuner_count_read(self._buffer)
            values = list(self._buffer)
        tags = [ThreadCount(*values[3 + 3 * tag : 6 + 3 * tag]) for tag in range(_TAGS)]
        return ProcessCount(
            live_bytes=values[0],
            peak_bytes=values[1],
            allocations=values[2],
            other=tags[OTHER],
            step=tags[STEP],
            collective=tags[COLLECTIVE],
        )

    def tag_this_thread(self, tag: int) -> None:
        """From now on, allocations of the calling thread carry ``tag``."""
        self._library.tuner_count_set_thread_tag(tag)

    @contextmanager
    def tagged(self, tag: int) -> Iterator[None]:
        """Allocations of the calling thread inside the block carry ``tag``."""
        before = self._library.tuner_count_thread_tag()
        self._library.tuner_count_set_thread_tag(tag)
        try:
            yield
        finally:
            self._library.tuner_count_set_thread_tag(before)

    def serial(self) -> int:
        """The serial number the next allocation will carry."""
        return int(self._library.tuner_count_serial())

    def live_since(self, serial: int, tag: int) -> int:
        """Bytes of the live blocks allocated from ``serial`` on by threads tagged ``tag``."""
        return int(self._library.tuner_count_live_since(serial, tag))

    def serial_of(self, address: int, tag: int) -> int:
        """The serial number of the live block allocated at ``address`` by a thread tagged
        ``tag``; -1 where no such block starts there (allocated before the counter, by
        another, or elsewhere)."""
        return int(self._library.tuner_count_serial_of(address, tag))

    @contextmanager
    def limited(self, live_bytes: int | None) -> Iterator[None]:
        """Inside the block, an allocation of a thread tagged :data:`STEP` that would take
        what the process holds past ``live_bytes`` raises ``torch.OutOfMemoryError``
        (before anything is allocated); ``None``: no limit."""
        self._library.tuner_count_set_limit(-1 if live_bytes is None else live_bytes)
        try:
            yield
        finally:
            self._library.tuner_count_set_limit(-1)

    def push(self) -> None:
        """Open a nested count: peaks restart from what is live now."""
        self._library.tuner_count_push()

    def pop(self) -> None:
        """Close the innermost count: the enclosing one takes in its peaks."""
        self._library.tuner_count_pop()

    @contextmanager
    def block(self) -> Iterator[BlockCount]:
        """Counts the block, the calling thread tagged as the step's. Blocks may nest."""
        count = BlockCount()
        # Blocks nest: the enclosing block's peak takes in this one's when it closes.
        self._library.tuner_count_push()
        try:
            start = self.read()
            with self.tagged(STEP):
                yield count
            end = self.read()
        finally:
            self._library.tuner_count_pop()
        count.peak_bytes = end.peak_bytes - start.step.live_bytes
        count.collective_peak_bytes = end.collective.peak_bytes
        count.other_threads_peak_bytes = end.other.peak_bytes
        count.other_threads_allocations = end.other.allocations


_installed: ProcessAllocations | None = None
_unavailable: str | None = None


def process_allocations() -> ProcessAllocations | None:
    """The process's counter, built (once per machine) and installed at the first call;
    ``None``, with one warning line saying what to install, where it cannot be built."""
    global _installed, _unavailable
    if _installed is not None or _unavailable is not None:
        return _installed
    try:
        library = ctypes.CDLL(_build())
    except (OSError, RuntimeError) as exc:  # no compiler, no ninja, a failed build
        _unavailable = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        warnings.warn(NO_EXACT_COUNT.format(reason=_unavailable), RuntimeWarning, stacklevel=2)
        return None
    library.tuner_count_read.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    library.tuner_count_set_thread_tag.argtypes = [ctypes.c_int]
    library.tuner_count_serial.restype = ctypes.c_int64
    library.tuner_count_live_since.argtypes = [ctypes.c_int64, ctypes.c_int]
    library.tuner_count_live_since.restype = ctypes.c_int64
    library.tuner_count_serial_of.argtypes = [ctypes.c_void_p, ctypes.c_int]
    library.tuner_count_serial_of.restype = ctypes.c_int64
    library.tuner_count_set_limit.argtypes = [ctypes.c_int64]
    if library.tuner_count_install() != 1:
        # Another allocator took the highest priority first: what torch hands out is not
        # ours to count.
        _unavailable = "another CPU allocator is installed at the highest priority"
        warnings.warn(NO_EXACT_COUNT.format(reason=_unavailable), RuntimeWarning, stacklevel=2)
        return None
    _installed = ProcessAllocations(library)
    return _installed


def _build() -> str:
    """The shared library's path, compiled when the source or torch changed (the cache's
    own check), else the one built before."""
    from torch.utils import cpp_extension

    _find_ninja()
    # Named by its source: torch's cache keeps one build per name, and two versions of this
    # file (two checkouts, an upgrade) must not rebuild, or load, each other's library.
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
    path = cpp_extension.load(
        f"{_NAME}_{digest}",
        [str(_SOURCE)],
        extra_cflags=["-O2"],
        is_python_module=False,
        verbose=False,
    )
    # With is_python_module=False, load() loads the library and returns its path.
    if not isinstance(path, str):
        raise RuntimeError(f"torch.utils.cpp_extension.load returned {path!r}, not a path")
    return path


def _find_ninja() -> None:
    """Put the ``ninja`` the ``torch`` extra installs (the PyPI wheel, in the environment's
    own ``bin``) on ``PATH`` when none is there: torch's build looks for it on ``PATH``
    only, and an environment's ``bin`` is not on it unless the environment is activated."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return  # the build then says what is missing, and the count falls back
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
