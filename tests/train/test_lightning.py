"""TunerCallback on a real LightningModule and a real Trainer on the CPU under a memory
limit: the module's own step profiled on its own longest sample, the batch size and the
accumulation set so that the global batch is the one asked, the profile stored and used
again, the module and the RNG left as they were, bad input refused in one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from torch.utils.data import DataLoader

from tests.train.lightning_modules import LONGEST, LONGEST_AT, TokenModel, pad, trainer
from tuner.client import TunerClient
from tuner.core.errors import BadInputError
from tuner.engine.backends import make_backend
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import Workload
from tuner.train import planning
from tuner.train.lightning import TunerCallback

LIMIT = "2MiB"
BATCH = 64

# Lightning's own pytree helper trips a deprecation in this torch; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TunerClient]:
    with TunerClient(f"sqlite:///{tmp_path / 'tuner.db'}", cache_dir=tmp_path / "cache") as c:
        yield c


class Snapshot(pl.Callback):
    """What the module, the Trainer (its stage, step counters, logged metrics), its
    optimizer and the RNG hold when fit starts."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.weights = {k: v.clone() for k, v in pl_module.state_dict().items()}
        self.grads = [p.grad for p in pl_module.parameters()]
        self.training = [m.training for m in pl_module.modules()]
        self.rng = torch.get_rng_state()
        self.optimizer_state = len(trainer.optimizers[0].state)
        self.optimizer_groups = [dict(g, params=None) for g in trainer.optimizers[0].param_groups]
        self.trainer_state = (
            trainer.state.fn,
            trainer.state.stage,
            trainer.global_step,
            trainer.current_epoch,
            dict(trainer.callback_metrics),
        )


def test_the_callback_profiles_the_modules_own_step_on_its_longest_sample(
    client: TunerClient, tmp_path: Path
) -> None:
    module = TokenModel()
    before, after = Snapshot(), Snapshot()
    tuner = TunerCallback(global_batch_size=BATCH, device="cpu", memory_limit=LIMIT, client=client)
    fitted = trainer([before, tuner, after], str(tmp_path))
    fitted.fit(module)

    tuned = tuner.tuned
    assert tuned is not None
    # The worst case is the one long sample among short ones, found by the scan.
    assert tuned.worst_case.index == LONGEST_AT
    assert tuned.workload.sample_batch(3)["input_ids"].shape == (3, LONGEST)
    found = tuned.recommendation.max_micro_batch_size
    assert 1 <= module.batch_size <= found < BATCH
    assert module.batch_size * fitted.accumulate_grad_batches == BATCH
    # What was probed is the module's step, exactly: a hand-written workload of the same
    # model, optimizer and worst-case batch finds the same M*.
    assert found == _hand_written_max(module)
    # Probing left the module, the Trainer's optimizer and the RNG as they were.
    assert after.weights.keys() == before.weights.keys()
    assert all(torch.equal(after.weights[k], before.weights[k]) for k in before.weights)
    assert after.grads == before.grads == [None] * len(before.grads)
    assert after.training == before.training
    assert torch.equal(after.rng, before.rng)
    assert after.optimizer_state == before.optimizer_state == 0
    assert after.optimizer_groups == before.optimizer_groups
    # ... and the Trainer's stage, step counters and logged metrics (self.log is silenced).
    assert after.trainer_state == before.trainer_state
    # The profile is stored like any other, under the module's name.
    (stored,) = client.list_profiles().data
    assert stored.max_micro_batch_size == found
    assert stored.workload_name == "lightning-TokenModel"


def _hand_written_max(module: TokenModel) -> int:
    fresh = TokenModel()
    fresh.load_state_dict(module.state_dict())
    longest = fresh.samples[LONGEST_AT]

    def loss_fn(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["input_ids"])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    workload = Workload(
        model=fresh,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        make_batch=lambda n: pad([longest] * n),
        loss_fn=loss_fn,
    )
    backend = make_backend("cpu", memory_limit_bytes=2 * 2**20)
    return profile_workload(workload, backend).max_micro_batch_size


def test_a_second_fit_asks_the_service_and_probes_nothing(
    client: TunerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = TunerCallback(global_batch_size=BATCH, device="cpu", memory_limit=LIMIT, client=client)
    trainer([first], str(tmp_path)).fit(TokenModel())

    def no_probing(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the stored profile should have answered")

    monkeypatch.setattr(planning, "profile_workload", no_probing)
    module = TokenModel(batch_size=1)
    again = TunerCallback(global_batch_size=BATCH, device="cpu", memory_limit=LIMIT, client=client)
    trainer([again], str(tmp_path)).fit(module)
    assert again.tuned is not None
    assert first.tuned is not None
    assert module.batch_size == first.tuned.micro_batch_size
    assert again.tuned.recommendation.basis == "measured"


def test_named_lengths_find_the_longest_sample_a_short_scan_misses(
    client: TunerClient, tmp_path: Path
) -> None:
    module = TokenModel()
    lengths = [len(sample["input_ids"]) for sample in module.samples]
    tuner = TunerCallback(
        global_batch_size=BATCH,
        device="cpu",
        memory_limit=LIMIT,
        client=client,
        lengths=lengths,
        scan=4,  # would read samples 0, 30, 60, 90 and miss the long one
    )
    trainer([tuner], str(tmp_path)).fit(module)
    assert tuner.tuned is not None
    assert (tuner.tuned.worst_case.index, tuner.tuned.worst_case.size) == (LONGEST_AT, LONGEST)


class Tokens(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 2
        self.samples = TokenModel().samples

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.samples, batch_size=self.batch_size, collate_fn=pad)  # type: ignore[arg-type]


class FromData(TokenModel):
    """Reads its data from a datamodule, as most projects do."""

    def __init__(self) -> None:
        super().__init__()
        del self.batch_size


def test_a_datamodules_batch_size_is_set_and_a_url_names_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"  # a URL crosses ddp_spawn's pickling
    tuner = TunerCallback(global_batch_size=BATCH, device="cpu", memory_limit=LIMIT, client=url)
    data = Tokens()
    trainer([tuner], str(tmp_path)).fit(FromData(), datamodule=data)
    assert tuner.tuned is not None
    assert data.batch_size == tuner.tuned.micro_batch_size
    assert data.batch_size * tuner.tuned.accumulation_steps == BATCH
    with TunerClient(url, cache_dir=tmp_path / "cache") as client:
        assert len(client.list_profiles().data) == 1


class NoBatchSize(TokenModel):
    def __init__(self) -> None:
        super().__init__()
        del self.batch_size

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.samples, batch_size=4, collate_fn=pad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("module", "options", "fit", "message"),
    [
        (NoBatchSize, {}, {}, "batch_size_attr="),
        (TokenModel, {"device": "meta"}, {}, "but the model is on cpu"),
        (TokenModel, {"lengths": [1, 2]}, {}, "lengths has 2 entries but the dataset holds 120"),
        (
            TokenModel,
            {},
            {"train_dataloaders": DataLoader([0, 1], batch_size=1)},  # type: ignore[arg-type]
            "define train_dataloader() in the LightningModule",
        ),
    ],
    ids=["no-batch-size", "other-device", "lengths-mismatch", "dataloader-given-to-fit"],
)
def test_what_cannot_be_tuned_is_refused_in_one_line(
    client: TunerClient,
    tmp_path: Path,
    module: type[TokenModel],
    options: dict[str, Any],
    fit: dict[str, Any],
    message: str,
) -> None:
    tuner = TunerCallback(
        global_batch_size=BATCH, memory_limit=LIMIT, client=client, **{"device": "cpu", **options}
    )
    model = module()
    with pytest.raises(BadInputError) as refused:
        trainer([tuner], str(tmp_path)).fit(model, **fit)
    assert message in refused.value.message
    assert "\n" not in refused.value.message
    assert client.list_profiles().data == []  # refused before probing


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"global_batch_size": 0}, "global_batch_size=0"),
        ({"global_batch_size": 8, "memory_limit": "lots"}, "cannot read memory size 'lots'"),
        ({"global_batch_size": 8, "policy": "fastest"}, "policy='fastest'"),
    ],
)
def test_bad_settings_are_refused_when_the_callback_is_made(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadInputError, match=message):
        TunerCallback(**options)


def test_a_schedule_of_accumulation_is_refused(client: TunerClient, tmp_path: Path) -> None:
    tuner = TunerCallback(global_batch_size=BATCH, device="cpu", memory_limit=LIMIT, client=client)
    schedule = GradientAccumulationScheduler({0: 2})
    with pytest.raises(BadInputError, match="GradientAccumulationScheduler sets"):
        trainer([schedule, tuner], str(tmp_path)).fit(TokenModel())
