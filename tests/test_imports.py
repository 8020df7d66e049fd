"""The package root, the plan, the results schema and the service import without torch."""

from __future__ import annotations

import pytest

import tuner
from tests.helpers import run_python


def test_torch_free_modules_do_not_import_torch() -> None:
    # A fresh interpreter: this test process imported torch long ago.
    child = run_python(
        "import sys, tuner, tuner.plan, tuner.results, api\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
        "print('ok')\n"
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "ok"


def test_root_loads_torch_names_on_first_use() -> None:
    from tuner.profiler import profile_workload
    from tuner.workload import Workload, load_workload

    assert tuner.Workload is Workload
    assert tuner.load_workload is load_workload
    assert tuner.profile_workload is profile_workload
    assert set(tuner.__all__) >= {"Workload", "load_workload", "profile_workload", "recommend"}


def test_root_refuses_unknown_names() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = tuner.nope
