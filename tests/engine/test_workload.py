"""tuner.engine.workload: what a user hands us, loaded from ``package.module:function``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests import workloads
from tests.workloads import first_layer, tiny, wrong_batch_size
from tuner.core.errors import BadInputError, WorkloadError
from tuner.engine.workload import Workload, load_workload, parse_options


def test_load_workload_calls_the_factory_with_options() -> None:
    workload = load_workload("tests.workloads:tiny", {"width": 24, "precision": "bf16"})
    assert isinstance(workload, Workload)
    assert first_layer(workload).out_features == 24
    assert workload.precision == "bf16"
    assert workload.target == "tests.workloads:tiny"
    assert workload.name == "Tiny"  # the model's class when the factory gives no name


def test_load_workload_accepts_a_workload_object() -> None:
    workload = load_workload("tests.workloads:PREBUILT")
    assert workload is workloads.PREBUILT
    assert workload.target == "tests.workloads:PREBUILT"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("examples.mlp", "must look like package.module:function"),
        ("examples.mlp:", "must look like package.module:function"),
        (":workload", "must look like package.module:function"),
        (".mlp:workload", "must look like package.module:function"),
        ("examples.no_such_module:workload", "cannot import 'examples.no_such_module'"),
        ("no_such_package.mod:workload", "PYTHONPATH"),
        ("examples.mlp:no_such_factory", "has no attribute 'no_such_factory'"),
        ("tests.workloads:NOT_CALLABLE", "neither a Workload nor a function"),
        ("tests.workloads:not_a_workload", "returned dict, not a tuner.Workload"),
    ],
)
def test_load_workload_errors_say_what_is_wrong(target: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message) as info:
        load_workload(target)
    assert isinstance(info.value, BadInputError)  # the CLI turns it into exit status 2
    assert info.value.__cause__ is None  # one message, not a chain of import internals


@pytest.mark.parametrize(
    "options", [{"no_such_option": 1}, {"hidden": 64, "colour": "red"}], ids=["unknown", "extra"]
)
def test_load_workload_refuses_options_the_factory_does_not_take(
    options: dict[str, object],
) -> None:
    with pytest.raises(WorkloadError, match=r"do not fit examples\.mlp:workload"):
        load_workload("examples.mlp:workload", options)


def test_load_workload_refuses_a_bad_option_value() -> None:
    with pytest.raises(WorkloadError, match="unknown precision 'fp8'"):
        load_workload("examples.mlp:workload", {"precision": "fp8"})


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        (["precision=bf16"], {"precision": "bf16"}),
        (["layers=4", "lr=1e-3"], {"layers": 4, "lr": 0.001}),
        (["flag=true", "other=false", "none=null"], {"flag": True, "other": False, "none": None}),
        (['name="quoted"'], {"name": "quoted"}),
        (["sizes=[1, 2]"], {"sizes": [1, 2]}),
        (["empty="], {"empty": ""}),
        (["path=a=b"], {"path": "a=b"}),  # only the first '=' separates
        (["x=1", "x=2"], {"x": 2}),  # the last one wins, as with repeated flags
        ([], {}),
    ],
)
def test_parse_options_reads_json_values_and_strings(
    pairs: list[str], expected: dict[str, object]
) -> None:
    assert parse_options(pairs) == expected


@pytest.mark.parametrize("pair", ["precision", "=bf16", "1layers=4", "my-option=3", " x=1"])
def test_parse_options_refuses_pairs_that_are_not_name_value(pair: str) -> None:
    with pytest.raises(WorkloadError, match="must look like name=value"):
        parse_options([pair])


def test_sample_batch_checks_the_number_of_samples() -> None:
    with pytest.raises(WorkloadError, match=r"make_batch\(3\) of Tiny returned 4 samples"):
        wrong_batch_size().sample_batch(3)
    inputs, labels = tiny().sample_batch(3)
    assert inputs.shape[0] == labels.shape[0] == 3


@pytest.mark.parametrize(
    ("make_batch", "message"),
    [
        (lambda n: [1, 2, 3], "at least one tensor"),
        (lambda n: torch.tensor(1.0), "at least one tensor"),  # no sample dimension
        (lambda n: (torch.zeros(n, 2), torch.zeros(n + 1)), "disagree on the number of samples"),
    ],
    ids=["no-tensors", "scalar", "disagreeing"],
)
def test_sample_batch_refuses_batches_without_a_clear_size(
    make_batch: object, message: str
) -> None:
    workload = tiny()
    workload.make_batch = make_batch  # type: ignore[assignment]
    with pytest.raises(WorkloadError, match=message):
        workload.sample_batch(2)


def _parts() -> dict[str, object]:
    model = nn.Linear(2, 2)
    return {
        "model": model,
        "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
        "make_batch": lambda n: torch.zeros(n, 2),
        "loss_fn": lambda model, batch: model(batch).sum(),
    }


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"precision": "fp8"}, "unknown precision 'fp8': use one of fp32, bf16, fp16"),
        ({"precision": "float16"}, "unknown precision"),
        ({"model": "a model"}, "must be a torch.nn.Module, got str"),
        ({"optimizer": 0.1}, "must be a torch.optim.Optimizer or a factory"),
        ({"make_batch": None}, "make_batch must be callable"),
        ({"loss_fn": "mse"}, "loss_fn must be callable"),
    ],
)
def test_workload_refuses_invalid_fields(override: dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        Workload(**{**_parts(), **override})  # type: ignore[arg-type]


def test_build_optimizer_creates_the_instance_once() -> None:
    workload = Workload(**_parts())  # type: ignore[arg-type]
    optimizer = workload.build_optimizer()
    assert isinstance(optimizer, torch.optim.SGD)
    assert workload.build_optimizer() is optimizer
    assert workload.name == "Linear"


def test_build_optimizer_refuses_a_factory_that_returns_something_else() -> None:
    parts = _parts()
    parts["optimizer"] = lambda params: "adam"
    workload = Workload(**parts)  # type: ignore[arg-type]
    with pytest.raises(WorkloadError, match=r"must return a torch\.optim\.Optimizer, got str"):
        workload.build_optimizer()


def test_targets_load_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user's training code next to where they run `tuner profile`, not installed.
    (tmp_path / "my_training.py").write_text(
        "from tests.workloads import tiny\n\ndef workload():\n    return tiny(width=12)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_training", raising=False)
    try:
        workload = load_workload("my_training:workload")
    finally:
        sys.modules.pop("my_training", None)
    assert first_layer(workload).out_features == 12
