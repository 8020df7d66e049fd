"""tune_trainer on a real transformers Trainer (a tiny GPT-2 from its config) on the CPU
under a memory limit: the Trainer's own model, optimizer, collator and compute_loss
profiled on the longest sample of its own dataset, its batch size and accumulation set so
that the global batch is the one asked, the model left as it was, training then running
at the answer."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.hf.trainers import LONGEST, LONGEST_AT, pad, token_samples, trainer
from tuner.client import TunerClient
from tuner.core.errors import BadInputError
from tuner.engine.backends import make_backend
from tuner.engine.profiler import profile_workload
from tuner.engine.workload import Workload
from tuner.train.huggingface import tune_trainer

MiB = 2**20
LIMIT = 16 * MiB
BATCH = 48


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TunerClient]:
    with TunerClient(f"sqlite:///{tmp_path / 'tuner.db'}", cache_dir=tmp_path / "cache") as c:
        yield c


@pytest.mark.slow
def test_the_trainers_own_step_is_profiled_on_its_longest_sample(
    client: TunerClient, tmp_path: Path
) -> None:
    hf = trainer(tmp_path)
    weights = {k: v.clone() for k, v in hf.model.state_dict().items()}
    rng = torch.get_rng_state()
    tuned = tune_trainer(hf, global_batch_size=BATCH, memory_limit=LIMIT, client=client)

    found = tuned.recommendation.max_micro_batch_size
    args = hf.args
    assert 1 <= args.per_device_train_batch_size <= found < BATCH
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == BATCH
    assert hf.get_total_train_batch_size(args) == BATCH  # what the Trainer itself will run
    # The columns the model does not take were removed by the Trainer's own collator.
    assert tuned.worst_case.index == LONGEST_AT
    batch = tuned.workload.sample_batch(2)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == (2, LONGEST)
    # Left as it was: weights, no gradients, RNG, no optimizer built.
    state = hf.model.state_dict()
    assert all(torch.equal(state[k], weights[k]) for k in weights)
    assert all(p.grad is None for p in hf.model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    assert hf.optimizer is None
    # The Trainer's step, exactly: the same model, fused AdamW (the Trainer's default) in
    # its weight-decay groups and the model's own loss find the same M* by hand.
    assert found == _hand_written_max(hf)
    # And training runs at the answer.
    assert hf.train().global_step == 1


def _hand_written_max(hf: Any) -> int:
    from tests.hf.trainers import model

    fresh = model()
    fresh.load_state_dict(hf.model.state_dict())
    longest = token_samples()[LONGEST_AT]
    decay = set(hf.get_decay_parameter_names(fresh))

    def optimizer(_params: Any) -> torch.optim.Optimizer:
        named = list(fresh.named_parameters())
        groups = [
            {"params": [p for n, p in named if n in decay], "weight_decay": 0.0},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=5e-5, fused=True)

    workload = Workload(
        model=fresh,
        optimizer=optimizer,
        make_batch=lambda n: pad([longest] * n),
        loss_fn=lambda m, batch: m(**batch).loss,
    )
    backend = make_backend("cpu", memory_limit_bytes=LIMIT)
    return profile_workload(workload, backend).max_micro_batch_size


@pytest.mark.slow
def test_checkpointing_the_arguments_ask_for_is_profiled_and_then_put_back(
    client: TunerClient, tmp_path: Path
) -> None:
    plain = tune_trainer(
        trainer(tmp_path), global_batch_size=BATCH, memory_limit=LIMIT, client=client
    )
    hf = trainer(tmp_path, activation_checkpointing=True)
    checkpointed = tune_trainer(hf, global_batch_size=BATCH, memory_limit=LIMIT, client=client)
    # Recomputing activations in backward fits more, and is another workload (key).
    assert (
        checkpointed.recommendation.max_micro_batch_size > plain.recommendation.max_micro_batch_size
    )
    assert checkpointed.workload.activation_checkpointing
    assert not plain.workload.activation_checkpointing
    # The Trainer turns checkpointing on when training starts; until then it stays off.
    assert not any(getattr(m, "gradient_checkpointing", False) for m in hf.model.modules())


@pytest.mark.slow
def test_the_length_column_the_trainer_samples_by_names_the_worst_case(
    client: TunerClient, tmp_path: Path
) -> None:
    hf = trainer(tmp_path, train_sampling_strategy="group_by_length")
    lengths = [len(s["input_ids"]) for s in token_samples()]

    class Columns(list[dict[str, Any]]):
        """A dataset with a precomputed length column, as ``datasets`` gives one."""

        column_names = ("input_ids", "length")

        def __getitem__(self, key: Any) -> Any:
            return lengths if key == "length" else super().__getitem__(key)

    hf.train_dataset = Columns(token_samples())
    # A scan of 4 samples (0, 22, 45, 67) would miss sample 41; the column names it.
    tuned = tune_trainer(hf, global_batch_size=BATCH, memory_limit=LIMIT, client=client, scan=4)
    assert (tuned.worst_case.index, tuned.worst_case.size) == (LONGEST_AT, LONGEST)
    assert tuned.worst_case.named_lengths


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train_dataset": None}, "no train_dataset"),
        ({"device": "meta"}, "but the model is on cpu"),
        ({"global_batch_size": 0}, "global_batch_size=0"),
        ({"lengths": [3]}, "lengths has 1 entries but the dataset holds 90"),
    ],
)
def test_what_cannot_be_tuned_is_refused_in_one_line_and_changes_nothing(
    client: TunerClient, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    hf = trainer(tmp_path)
    if "train_dataset" in change:
        hf.train_dataset = change.pop("train_dataset")
    options: dict[str, Any] = {"global_batch_size": BATCH, "memory_limit": LIMIT, **change}
    with pytest.raises(BadInputError) as refused:
        tune_trainer(hf, client=client, **options)
    assert message in refused.value.message
    assert "\n" not in refused.value.message
    assert (hf.args.per_device_train_batch_size, hf.args.gradient_accumulation_steps) == (8, 1)


RANKS_SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
from pathlib import Path
from tests.hf.trainers import trainer
from tuner.train.huggingface import tune_trainer
torch.set_num_threads(1)
out = Path(sys.argv[1])
hf = trainer(out, ddp_backend="gloo")
tuned = tune_trainer(hf, global_batch_size=48, memory_limit="16MiB", client=sys.argv[2])
args = hf.args
steps = hf.train().global_step
# A file a rank: the ranks' prints would interleave on one stdout.
(out / f"rank{args.process_index}.json").write_text(json.dumps([
    args.per_device_train_batch_size, args.gradient_accumulation_steps,
    hf.get_total_train_batch_size(args), steps,
]))
dist.destroy_process_group()
# A plain Trainer run under torchrun on gloo aborts now and then at interpreter exit
# ("terminate called without an active exception", with or without tune_trainer): the
# results are written, so leave without the teardown.
os._exit(0)
"""


@pytest.mark.slow
def test_under_torchrun_every_rank_gets_rank_zeros_plan(tmp_path: Path) -> None:
    """Two real gloo ranks (torchrun, 127.0.0.1, time-boxed): rank 0 profiles, both set
    the same micro batch and accumulation, and the batch is split over the two ranks."""
    from tests.helpers import subprocess_env
    from tests.services import free_port

    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    done = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            str(script), str(tmp_path / "out"), url,
        ],
        cwd=Path(__file__).parents[2],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,  # a hang fails the test
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]  # the same plan on every rank
    micro, steps, total, trained = ranks[0]
    assert micro * steps * 2 == total == 48
    assert trained == 1
    with TunerClient(url, cache_dir=tmp_path / "cache") as client:
        assert len(client.list_profiles().data) == 1  # rank 0 alone profiled
