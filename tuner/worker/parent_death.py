"""A profile subprocess dies with its worker, even when the worker is killed with SIGKILL.

The profile stays in the worker's process group, so a Ctrl-C or a supervisor that ends
the group ends both. But SIGKILL to the worker alone (the kernel's OOM killer, ``kill -9
PID``) runs no handler: the profile lived on, re-parented to PID 1, holding GPU memory
while the service gave its job to another worker.

On Linux the kernel can send a signal to a process when its parent dies:
``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set in the child between ``fork`` and ``exec`` (it
survives ``exec``). It is called through ctypes from ``libc``, resolved once in the parent,
so the child runs one foreign call and nothing that could take a lock another thread of
the worker held at the fork (Python's warning about ``preexec_fn`` in threaded programs).
No library offers more than this one call (``python-prctl`` wraps all of prctl and needs
a compiler), so it is written here. Elsewhere the group rule above is what remains.

The signal is sent when the *thread* that started the child ends, not the process: the
worker starts profiles from the thread that waits for them, so the two end together.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# What the child exits with when its parent died before the signal was armed.
ORPHANED_EXIT = 128 + signal.SIGKILL


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies; None
    where the kernel offers no such thing (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            # The parent died between the fork and the prctl: no signal will ever come.
            os._exit(ORPHANED_EXIT)

    return arm
