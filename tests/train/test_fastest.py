"""time_splits: the fewest equal micro batches timed against more, smaller ones, on a real
LightningModule; a smaller split is chosen only when the paired timed rounds show it
faster with 95% confidence, and the global batch stays exact."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from tests.train.lightning_modules import TokenModel, trainer
from tuner.core.speeds import SpeedCurve, TimedSize
from tuner.train.fastest import candidate_micro_batches, fastest, timed_splits
from tuner.train.lightning import TunerCallback

# Lightning's own pytree helper trips a deprecation in this torch; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`")


@pytest.mark.parametrize(
    ("per_rank", "largest", "candidates"),
    [(64, 5, [4, 2, 1]), (256, 64, [64, 32, 16, 8]), (100, 31, [25, 10, 5, 2]), (37, 10, [1])],
)
def test_candidates_divide_the_batch_and_halve_from_the_fewest_steps(
    per_rank: int, largest: int, candidates: list[int]
) -> None:
    assert candidate_micro_batches(per_rank, largest) == candidates


@pytest.mark.parametrize(
    ("smaller", "chosen", "says"),
    [
        ((0.0080, 0.0081, 0.0082), 16, "over 3 paired timed rounds, at least 24% with 95%"),
        ((0.0097, 0.0099, 0.0102), 32, "2% faster, which 3 paired timed rounds (gains +0% to"),
        ((0.0110, 0.0111, 0.0112), 32, "the fewest that divide the batch, also the fastest"),
    ],
    ids=["beyond-spread", "within-spread", "fewest-fastest"],
)
def test_a_smaller_split_wins_only_when_the_paired_rounds_show_it(
    smaller: tuple[float, ...], chosen: int, says: str
) -> None:
    speeds = SpeedCurve(
        sizes=[
            TimedSize(micro_batch_size=16, seconds_per_sample=list(smaller)),
            TimedSize(micro_batch_size=32, seconds_per_sample=[0.0100, 0.0101, 0.0102]),
        ],
        optimizer_seconds=0.0,
    )
    picked, why = fastest(speeds, 64, [32, 16])
    assert picked == chosen
    assert says in why


def test_the_callback_times_its_candidates_and_keeps_the_global_batch(tmp_path: Path) -> None:
    module = TokenModel()
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    tuner = TunerCallback(
        global_batch_size=64,
        device="cpu",
        memory_limit="2MiB",
        client=f"sqlite:///{tmp_path / 'tuner.db'}",
        time_splits=True,
    )
    seen: dict[str, torch.Tensor] = {}

    class Snapshot(pl.Callback):
        def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            seen.update({k: v.clone() for k, v in pl_module.state_dict().items()})

    fitted = trainer([tuner, Snapshot()], str(tmp_path))
    fitted.fit(module)
    tuned = tuner.tuned
    assert tuned is not None
    # M* is 5 for the longest sample at 2 MiB: 4, 2 and 1 divide 64.
    assert [t.micro_batch_size for t in tuned.timed] == [4, 2, 1]
    assert all(len(t.speeds) == 3 and t.samples_per_second > 0 for t in tuned.timed)
    assert tuned.speeds is not None
    assert tuned.timed == tuple(timed_splits(tuned.speeds, 64))
    picked, why = fastest(tuned.speeds, 64, [4, 2, 1])
    assert (tuned.micro_batch_size, tuned.timing_reason) == (picked, why)
    assert module.batch_size * fitted.accumulate_grad_batches == 64
    assert tuned.timing_s > 0
    assert all(torch.equal(seen[k], weights[k]) for k in weights)  # timing trained nothing
