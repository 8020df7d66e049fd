"""The package root, the core, the client, the worker and the service import without torch;
the rest of the public API loads from the root on first use."""

from __future__ import annotations

import pytest

import tuner
from tests.helpers import run_python


def test_torch_free_modules_do_not_import_torch() -> None:
    # A fresh interpreter: this test process imported torch long ago.
    child = run_python(
        "import sys, tuner, tuner.core.errors, tuner.core.plan, tuner.core.results\n"
        "import tuner.core.units, tuner.engine.search, tuner.cli\n"
        "import tuner.client, tuner.client.rest, tuner.client.transport\n"
        "import tuner.client.answer_cache\n"
        "import tuner.worker.loop, tuner.worker.profile_run\n"
        "import api, api.main, api.dashboard.routes\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
        "print('ok')\n"
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "ok"


def test_root_loads_the_public_api_on_first_use() -> None:
    from tuner.client import TunerClient
    from tuner.engine.backends import make_backend
    from tuner.engine.profiler import profile_workload
    from tuner.engine.workload import Workload, load_workload
    from tuner.train.accumulate import Accumulator
    from tuner.train.planning import plan_training

    assert tuner.Workload is Workload
    assert tuner.load_workload is load_workload
    assert tuner.profile_workload is profile_workload
    assert tuner.make_backend is make_backend
    assert tuner.Accumulator is Accumulator
    assert tuner.plan_training is plan_training
    assert tuner.TunerClient is TunerClient
    readme_api = {"Workload", "load_workload", "profile_workload", "recommend", "Accumulator"}
    assert set(tuner.__all__) >= readme_api | {"TunerClient", "plan_training"}
    assert all(hasattr(tuner, name) for name in tuner.__all__)


def test_root_refuses_unknown_names() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = tuner.nope
