"""Shared fixtures. Tests marked ``gpu`` need CUDA and are deselected where there is none."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# No deadline: a 2-core CI machine runs examples at uneven speed, and a deadline would
# turn scheduling noise into failures. No database: nothing is written into the repo.
settings.register_profile(
    "repo",
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("repo")

# A probe runs hundreds of tiny operators under the CPU tracker, each one an OpenMP
# parallel region. On a small shared machine the second thread is often descheduled and
# every operator waits for it (measured: 3 s instead of 0.03 s per CNN probe). Memory
# peaks do not depend on the thread count, so the tests run torch on one thread.
torch.set_num_threads(1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores this process may use, at most 4. Much of
    the suite waits (on servers, rank processes, browsers and the subprocesses it starts),
    and a third worker on two cores runs while the others wait."""
    return min(4, len(os.sched_getaffinity(0)) + 1)


@pytest.fixture(autouse=True)
def _client_cache_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TunerClient keeps answers for offline use in the user's cache directory; tests (and
    the commands they start) keep them in a directory of their own."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path_factory.mktemp("client-cache")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    deselected = [item for item in items if item.get_closest_marker("gpu")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``database_url`` is a SQLite file, and also a PostgreSQL database for tests marked
    ``both_stores`` (what depends on the store: migrations, concurrency, locking, types,
    the store's queries). A test that parametrizes it itself keeps its own values."""
    if "database_url" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        if "database_url" in (names.split(",") if isinstance(names, str) else names):
            return
    kinds = (
        ["sqlite", "postgres"]
        if metafunc.definition.get_closest_marker("both_stores")
        else ["sqlite"]
    )
    metafunc.parametrize("database_url", kinds, indirect=True)
