"""A CPU rank runs torch.profiler to count every thread's allocations; torch's C++ side
then talks on stderr (kineto's USDT lines at each start and stop, c10's
``CPUAllocator.cpp`` warning about a block freed during profiling that was allocated
before). Rank processes start without them; the environment is put back afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import subprocess_env
from tuner.engine.rank import QUIET_CPU_RANK_ENVIRONMENT, rank_environment

SCRIPT = """
import contextlib, multiprocessing, sys
from tuner.engine.rank import rank_environment

def rank():
    import torch
    from tuner.engine.backends.allocations import all_thread_allocations
    before = torch.ones(4096)
    with all_thread_allocations():
        del before  # allocated before the profiler started, freed while it runs
        torch.ones(64) + 1

if __name__ == "__main__":
    quiet = sys.argv[1] == "quiet"
    with rank_environment("cpu") if quiet else contextlib.nullcontext():
        process = multiprocessing.get_context("spawn").Process(target=rank)
        process.start()
    process.join()
    sys.exit(process.exitcode)
"""


def _rank_stderr(tmp_path: Path, mode: str) -> str:
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in subprocess_env().items() if k not in QUIET_CPU_RANK_ENVIRONMENT}
    done = subprocess.run(
        [sys.executable, str(script), mode],
        cwd=Path(__file__).parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.slow
def test_a_cpu_rank_starts_without_the_profilers_messages(tmp_path: Path) -> None:
    loud = _rank_stderr(tmp_path, "loud")
    assert "USDT" in loud  # what a rank printed before
    assert "CPUAllocator.cpp" in loud
    assert _rank_stderr(tmp_path, "quiet") == ""


def test_the_environment_is_put_back_and_a_users_own_value_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    with rank_environment("cpu"):
        assert os.environ["KINETO_LOG_LEVEL"] == "6"
        assert os.environ["TORCH_CPP_LOG_LEVEL"] == "INFO"
    assert "KINETO_LOG_LEVEL" not in os.environ
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "INFO"
    with rank_environment("cuda"):  # NCCL ranks run no profiler: their warnings matter
        assert "KINETO_LOG_LEVEL" not in os.environ
