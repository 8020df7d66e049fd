"""``tp_plan=auto``: the tensor-parallel plan transformers ships in a model's config
(``base_model_tp_plan``), on models the Llama plan cannot split (Phi-3's fused qkv and
gate-up projections, GPT-NeoX's fused qkv and split vocabulary, StarCoder2's c_fc/c_proj
MLP). On two real gloo ranks (127.0.0.1, time-boxed) the split step computes the loss one
process computes, each rank holding its share of the weights; what the plan cannot
split is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import subprocess_env
from tuner.cli import main
from tuner.core.errors import BadInputError, WorkloadError
from tuner.core.parallel import Parallel
from tuner.engine.mesh import auto_plan
from tuner.engine.parallel import check_parallel
from tuner.hf import causal_lm

DATA = Path(__file__).parents[1] / "data"
MODELS = ("phi3", "gpt_neox", "starcoder2")
TARGET = "tuner.hf:causal_lm"


def config(name: str) -> str:
    return str(DATA / f"tiny_{name}.json")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "phi3",
            {
                "model.layers.0.self_attn.qkv_proj": "colwise_gather_output",
                "model.layers.0.self_attn.o_proj": "rowwise_split_input",
                "model.layers.0.mlp.gate_up_proj": "colwise_gather_output",
                "model.layers.0.mlp.down_proj": "rowwise_split_input",
            },
        ),
        (
            "gpt_neox",
            {
                "gpt_neox.embed_in": "embedding_rowwise",
                "gpt_neox.layers.0.attention.query_key_value": "colwise",
                "gpt_neox.layers.0.attention.dense": "rowwise",
                "gpt_neox.layers.0.mlp.dense_h_to_4h": "colwise",
                "gpt_neox.layers.0.mlp.dense_4h_to_h": "rowwise",
            },
        ),
        (
            "starcoder2",
            {
                "model.layers.0.self_attn.q_proj": "colwise",
                "model.layers.0.self_attn.o_proj": "rowwise",
                "model.layers.0.mlp.c_fc": "colwise",
                "model.layers.0.mlp.c_proj": "rowwise",
            },
        ),
    ],
)
def test_the_models_own_plan_is_resolved_to_every_layer(
    name: str, expected: dict[str, str]
) -> None:
    plan = auto_plan(causal_lm(config=config(name), seq_len=8).model, 2)
    assert expected.items() <= plan.items()
    # Every layer, not only the first: layer 1 is split the way layer 0 is.
    assert {k.replace(".1.", ".0."): v for k, v in plan.items()} == {
        k: v for k, v in plan.items() if ".1." not in k
    }


def test_what_the_plan_cannot_split_is_refused_in_one_line() -> None:
    gpt2 = causal_lm(config=str(DATA / "tiny_gpt2.json"), seq_len=8).model
    with pytest.raises(BadInputError, match=r"has no tensor-parallel plan.*tp_plan=workload"):
        auto_plan(gpt2, 2)
    neox = causal_lm(config=config("gpt_neox"), seq_len=8).model
    with pytest.raises(WorkloadError, match=r"embed_in splits 128 rows, not evenly over 3"):
        auto_plan(neox, 3)
    starcoder = causal_lm(config=config("starcoder2"), seq_len=8).model
    with pytest.raises(WorkloadError, match=r"num_key_value_heads \(2\).*over 4 ranks"):
        auto_plan(starcoder, 4)
    tied = causal_lm(config={**_config("gpt_neox"), "tie_word_embeddings": True}, seq_len=8)
    with pytest.raises(BadInputError, match=r"gpt_neox.embed_in is split but its weight is tied"):
        auto_plan(tied.model, 2)
    workload = causal_lm(config=config("phi3"), seq_len=8)
    mesh = Parallel(mode="fsdp", tp=2, tp_plan="auto", sequence_parallel=True)
    with pytest.raises(BadInputError, match="sequence_parallel=true is for tp_plan=llama"):
        check_parallel(workload, mesh, 2)


def _config(name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(Path(config(name)).read_text())
    return loaded


def test_the_command_line_refuses_a_model_without_a_plan_before_any_rank_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(
        [
            "profile",
            TARGET,
            "-o",
            f"config={DATA / 'tiny_gpt2.json'}",
            "-o",
            "seq_len=8",
            "--device",
            "cpu",
            "--memory-limit",
            "64MiB",
            "--world-size",
            "2",
            "--parallel",
            "fsdp",
            "--tp",
            "2",
            "--parallel-option",
            "tp_plan=auto",
        ]
    )
    assert status == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "has no tensor-parallel plan" in line
    assert "tp_plan=workload" in line


@pytest.mark.slow
def test_the_auto_plan_computes_the_loss_one_process_computes(tmp_path: Path) -> None:
    """On two real ranks (1 × 2), the first step's loss equals one process's, for each
    model: the plan splits heads and MLPs without changing the numbers, and each rank
    holds a share of the weights."""
    code = f"""
import json, os, torch, torch.distributed as dist, torch.multiprocessing as mp
from tuner.core.parallel import Parallel
from tuner.engine.parallel import parallelize
from tuner.engine.workload import load_workload
CONFIGS = {json.dumps([config(name) for name in MODELS])}
def held(module):
    local = [getattr(p, "to_local", lambda: p)() for p in module.parameters()]
    return sum(t.numel() * t.element_size() for t in local)
def loss(path, parallel):
    workload = load_workload("{TARGET}", {{"config": path, "seq_len": 16}})
    workload.parallel = parallel
    module = parallelize(workload, parallel, torch.device("cpu"))
    return workload.loss_fn(module, workload.make_batch(3)).item(), held(module)
def rank(r, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    dist.init_process_group("gloo", rank=r, world_size=2)
    split = [loss(path, Parallel(mode="fsdp", tp=2, tp_plan="auto")) for path in CONFIGS]
    if r == 0:
        out.put(split)
    dist.destroy_process_group()
    # Past its result, a rank leaves without the interpreter's teardown, where gloo's
    # threads abort a process now and then (std::terminate; 1 run in 10 here).
    os._exit(0)
if __name__ == "__main__":
    import socket
    torch.set_num_threads(1)
    alone = [loss(path, Parallel()) for path in CONFIGS]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); os.environ["PORT"] = str(s.getsockname()[1])
    out = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(rank, args=(out,), nprocs=2, start_method="spawn")
    print(json.dumps([alone, out.get()]))
"""
    script = tmp_path / "auto_ranks.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=Path(__file__).parents[2],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,  # a hang fails the test
        check=False,
    )
    assert done.returncode == 0, done.stderr
    alone, split = json.loads(done.stdout.strip().splitlines()[-1])
    losses = [value for value, _ in alone]
    assert [value for value, _ in split] == pytest.approx(losses, rel=1e-5)
    assert len(set(losses)) == len(MODELS)  # three models, three losses
    # Each rank holds its share: the split layers' weights halved, the rest whole.
    for name, (_, whole), (_, share) in zip(MODELS, alone, split, strict=True):
        assert 0.5 * whole < share < 0.8 * whole, name
