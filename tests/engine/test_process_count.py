"""The exact count of the process's CPU allocations (a hook in front of torch's CPU
allocator, built with torch.utils.cpp_extension), in a child process of its own: once
installed it stays for the life of the process, and this one must not carry it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import subprocess_env

COUNT_EVERY_THREAD = """
import json, threading, torch
from tuner.engine.backends.process_count import COLLECTIVE, process_allocations

count = process_allocations()
readings = {}
with count.block() as outer:
    earlier = torch.empty(20000, dtype=torch.uint8)
    del earlier  # the enclosing block's peak, before the nested one restarts its own
    with count.block() as block:
        step = torch.empty(1000, dtype=torch.uint8)
        readings["step"] = count.read()
        with count.tagged(COLLECTIVE):
            gathered = torch.empty(5000, dtype=torch.uint8)
        kept = []
        worker = threading.Thread(target=lambda: kept.append(torch.empty(7000, dtype=torch.uint8)))
        worker.start()
        worker.join()
        readings["all"] = count.read()
        del gathered, kept[:]  # freed here, by the step's thread: counted where allocated
        storage = step.untyped_storage()
        storage.resize_(3000)  # FSDP's way: a new block of the new size, the old one freed
        readings["resized"] = count.read()
        empty = torch.empty(0)  # nothing held
        raw = torch.UntypedStorage(64)  # made by torch's default allocator, not ours
        readings["end"] = count.read()
lingering = []  # a collective's block another thread still holds when the next block begins
worker = threading.Thread(target=lambda: lingering.append(torch.empty(9000, dtype=torch.uint8)))
worker.start()
worker.join()
with count.block() as late:
    del lingering[:]  # let go inside the block: held at its start, not counted by the caller
    after = torch.empty(4000, dtype=torch.uint8)
print(json.dumps({
    "late_peak": late.peak_bytes,
    "outer_peak": outer.peak_bytes,
    "block_peak": block.peak_bytes,
    "collective_peak": block.collective_peak_bytes,
    "other_peak": block.other_threads_peak_bytes,
    "other_allocations": block.other_threads_allocations,
    **{name: [r.live_bytes, r.peak_bytes, r.step.live_bytes, r.collective.live_bytes,
              r.other.live_bytes] for name, r in readings.items()},
}))
"""


def _run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**subprocess_env(), "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_every_allocation_and_free_is_counted_on_every_thread_to_the_byte(
    tmp_path: Path,
) -> None:
    done = _run(COUNT_EVERY_THREAD, tmp_path)  # built here, in an empty extension cache
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # built without a word: a rank's output stays the workload's
    counted = json.loads(done.stdout)
    # live, peak, then live by where it was allocated: the step, a collective on the
    # step's thread, another thread.
    assert counted["step"] == [1000, 1000, 1000, 0, 0]
    assert counted["all"] == [13000, 13000, 1000, 5000, 7000]
    # The other thread's block and the collective's are gone; the step's 1000 B became 3000
    # B (both alive for the copy: 4000 B at that moment, below the peak).
    assert counted["resized"] == [3000, 13000, 3000, 0, 0]
    assert counted["end"] == counted["resized"]
    assert counted["block_peak"] == 13000
    assert counted["outer_peak"] == 20000
    # What the process held beyond the step thread's blocks at the start: the other
    # thread's 9000 B until it went, then the step's 4000 B.
    assert counted["late_peak"] == 9000
    assert counted["collective_peak"] == 5000
    assert counted["other_peak"] == 7000
    assert counted["other_allocations"] == 1


def test_without_a_compiler_the_cpu_rank_counts_with_the_profiler_and_says_so(
    tmp_path: Path,
) -> None:
    code = """
import warnings
from tuner.engine.backends import CpuBackend
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    backend = CpuBackend(2**30, count_all_threads=True)
print(backend.process_count is None)
print(*(str(w.message) for w in caught), sep="\\n")
"""
    done = _run(code, tmp_path, CXX=str(tmp_path / "no-compiler"))
    assert done.returncode == 0, done.stderr
    fell_back, *said = done.stdout.strip().splitlines()
    assert fell_back == "True"
    assert len(said) == 1
    assert "could not be built" in said[0]
    assert "install a C++ compiler and ninja" in said[0]
