"""The README's paths on models the project was not written around: a standing check.

Every architecture of the corpus (``bench/corpus_models.py``: transformers configs of
several families, small ResNet- and MobileNet-style CNNs, an LSTM language model) goes
through what a new user would run, each as its own ``tuner`` subprocess against a real
``tuner serve`` started here on 127.0.0.1 with a temporary SQLite store and a token made
by ``tuner token create``:

- ``profile``: ``tuner profile TARGET --device cpu --memory-limit L --global-batch-size B
  --json``: exit 0, an ``M*``, a plan whose split sums to ``B``.
- ``seq-lens``: ``--seq-lens`` at three lengths, where the factory takes ``seq_len``:
  a profile per length. Then each length is left out and estimated from the other two
  profiles (``tuner.core.lengths.estimate_length``, as ``tuner recommend --seq-len``
  answers a length never measured) against its measured ``M*``: the estimates must never
  be above it (issue 44); a length the fit cannot reach or whose error it cannot know is
  refused, and counted as such.
- ``ddp``, ``fsdp``: ``--world-size 2 --parallel ddp|fsdp``: two gloo ranks, an ``M*``.
- ``mesh``, ``fake-world``: FSDP × tensor parallelism by the named Llama plan
  (``--parallel fsdp --parallel-option tp_plan=llama --tp 2``): on two gloo ranks as
  1 × 2, and one rank of a 32 × 2 mesh standing for it in one process
  (``--world-size 64 --fake-world``). A model the plan cannot split is refused in one
  line, and the cell is ``n.a.``; a model that is not a transformers one needs a plan of
  its own.
- ``explore``: ``--explore``, where the workload declares variants: one chosen variant.
- ``json``: every document the ``--json`` commands above printed (each profile of
  ``--seq-lens``), sent as it is to ``POST /api/v1/profiles``: the README says the
  service stores exactly what ``--json`` prints.
- ``upload``: ``tuner profile ... --upload``, as the README's service section runs it.
- ``recommend``: ``tuner recommend --workload NAME --device NAME --global-batch-size B
  --json`` with the names the profile printed.
- ``train``: three accumulating optimizer steps (``Accumulator.for_workload``, each micro
  batch made as it is reached: ``step_samples``) with the service's answer (or, when
  ``recommend`` failed, the profile's own plan, and the cell says so), every loss finite
  and every split the answer's.

Each cell is ``pass`` (with a figure), ``FAIL`` (the failing command and its last line
of output are listed under the table) or ``n.a.`` with why. Run it before resolving an
issue that touches the engine.

Run: ``python bench/corpus.py`` (10 minutes for its first 12 models on 2 idle cores, so
about 22 for all 26, not timed whole); it rewrites its section of
BENCHMARKS.md and exits 1 when a cell failed. ``--only lstm,qwen2`` runs some
architectures, ``--paths profile,train`` some paths, ``--quick`` every path on the LSTM
alone: these write nothing. ``--jobs N`` runs N models at a time, ``--timeout S`` gives
each command S seconds (600; on a machine shared with other work, give more).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PATHS = (
    "profile",
    "seq-lens",
    "ddp",
    "fsdp",
    "mesh",
    "fake-world",
    "explore",
    "json",
    "upload",
    "recommend",
    "train",
)
# What the named tensor-parallel plan says of a model it cannot split: the path does not
# apply (a model with its own plan gives Workload(tp_plan=fn)).
NO_LLAMA_BLOCK = "has no Llama-like decoder block"
COMMAND_TIMEOUT_S = 600  # --timeout; a command slower than this is a failure (a hang)
SECTION = "corpus"


@dataclass(frozen=True)
class Architecture:
    """One model of the corpus and the budget that keeps its searches short."""

    name: str
    family: str
    target: str
    memory_limit: str
    global_batch_size: int
    config: str | None = None  # a key of HF_CONFIGS, written to a file as a user would
    options: tuple[str, ...] = ()
    seq_lens: str | None = None  # None: the factory takes no seq_len
    variants: bool = True


CORPUS: tuple[Architecture, ...] = (
    # One of each family first, so that a run cut short has covered every family.
    Architecture("qwen2", "decoder", "tuner.hf:causal_lm", "8MiB", 32, "qwen2",
                 ("seq_len=32",), "16,32,64"),
    Architecture("bert", "encoder", "tuner.hf:sequence_classification", "6MiB", 32, "bert",
                 ("seq_len=32",), "16,32,64"),
    Architecture("t5", "encoder-decoder", "tuner.hf:seq2seq_lm", "8MiB", 32, "t5",
                 ("seq_len=32",), "16,32,64"),
    Architecture("vit", "vision", "tuner.hf:image_classification", "8MiB", 32, "vit"),
    Architecture("resnet", "cnn", "bench.corpus_models:resnet", "16MiB", 64),
    Architecture("lstm", "recurrent", "bench.corpus_models:lstm_lm", "8MiB", 32,
                 options=("seq_len=32",), seq_lens="16,32,64"),
    Architecture("gpt_neox", "decoder", "tuner.hf:causal_lm", "8MiB", 32, "gpt_neox",
                 ("seq_len=32",), "16,32,64"),
    Architecture("distilbert", "encoder", "tuner.hf:sequence_classification", "6MiB", 32,
                 "distilbert", ("seq_len=32",), "16,32,64"),
    Architecture("bart", "encoder-decoder", "tuner.hf:seq2seq_lm", "8MiB", 32, "bart",
                 ("seq_len=32",), "16,32,64"),
    Architecture("mobilenet", "cnn", "bench.corpus_models:mobilenet", "16MiB", 64),
    Architecture("mistral", "decoder", "tuner.hf:causal_lm", "8MiB", 32, "mistral",
                 ("seq_len=32",), "16,32,64"),
    Architecture("phi", "decoder", "tuner.hf:causal_lm", "8MiB", 32, "phi",
                 ("seq_len=32",), "16,32,64"),
    # Families whose dry runs differed from the probes (a mask transformers builds on fake
    # tensors, a layout, a nonzero), each with the path that showed it.
    *(
        Architecture(name, "decoder", "tuner.hf:causal_lm", "8MiB", 32, name,
                     ("seq_len=32",), "16,32,64")
        for name in ("gemma", "gemma2", "granite", "olmo", "stablelm", "phi3", "falcon",
                     "bloom", "opt")
    ),
    Architecture("mbart", "encoder-decoder", "tuner.hf:seq2seq_lm", "8MiB", 32, "mbart",
                 ("seq_len=32",), "16,32,64"),
    Architecture("roberta", "encoder", "tuner.hf:sequence_classification", "6MiB", 32,
                 "roberta", ("seq_len=32",), "16,32,64"),
    Architecture("deberta_v2", "encoder", "tuner.hf:sequence_classification", "6MiB", 32,
                 "deberta_v2", ("seq_len=32",), "16,32,64"),
    Architecture("swin", "vision", "tuner.hf:image_classification", "4MiB", 32, "swin"),
    # transformers cannot checkpoint ConvNeXt: its factory declares no variants.
    Architecture("convnext", "vision", "tuner.hf:image_classification", "4MiB", 32,
                 "convnext", variants=False),
    # A mixture of experts (its dry run stops at an operator fake tensors reject) and a
    # state-space model (where a mode changed the count: issue 44).
    Architecture("mixtral", "mixture of experts", "tuner.hf:causal_lm", "8MiB", 32,
                 "mixtral", ("seq_len=32",), "16,32,64"),
    Architecture("mamba", "state space", "tuner.hf:causal_lm", "8MiB", 32, "mamba",
                 ("seq_len=32",), "16,32,64"),
)  # fmt: skip


@dataclass
class Cell:
    status: str  # "pass", "FAIL" or "n.a."
    note: str = ""
    command: str = ""
    line: str = ""
    seconds: float = 0.0


@dataclass
class Run:
    """What one architecture's paths share: the profile's names and plan."""

    arch: Architecture
    options: dict[str, str]  # the factory's -o options
    document: dict[str, Any] | None = None  # the one-process profile's --json
    printed: dict[str, dict[str, Any]] = field(default_factory=dict)  # each --json, by command
    answer: dict[str, Any] | None = None
    cells: dict[str, Cell] = field(default_factory=dict)
    # Each --seq-lens length left out: (length, the estimate or None where refused, M*).
    estimates: list[tuple[int, int | None, int]] = field(default_factory=list)

    def profile_args(self, *, without: str = "") -> list[str]:
        """``TARGET -o ... --device cpu --memory-limit L``, leaving out option ``without``."""
        arguments = [self.arch.target]
        for name, value in self.options.items():
            if name != without:
                arguments += ["-o", f"{name}={value}"]
        return [*arguments, "--device", "cpu", "--memory-limit", self.arch.memory_limit]


class Service:
    """``tuner serve`` on a free loopback port with a temporary SQLite store and a token."""

    def __init__(self, workdir: Path) -> None:
        from tests.services import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        database = f"sqlite:///{workdir / 'corpus.db'}"
        base_env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_DATABASE_URL": database}
        made = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "token", "create", "--name", "corpus",
             "--scope", "read", "--scope", "write"],
            env=base_env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        self.token = made.stdout.strip().splitlines()[-1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "serve", "--port", str(self.port)],
            env=base_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.url}/healthz", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("tuner serve did not answer /healthz within 60 s") from None
                time.sleep(0.3)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TUNER_URL": self.url,
            "TUNER_TOKEN": self.token,
            "TUNER_CACHE_DIR": str(workdir / "cache"),
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def last_line(text: str) -> str:
    """The line that says what went wrong: the last non-empty line of the output."""
    lines = [line.strip(" │┃|") for line in text.splitlines() if line.strip(" │┃|─━")]
    return lines[-1].strip() if lines else "(no output)"


def tuner(service: Service, args: list[str]) -> tuple[int, str, str, str]:
    """Run ``tuner ARGS``; return the exit status, stdout, stderr and the command as typed."""
    shown = " ".join(["tuner", *args])
    return (*run_process(service, ["-m", "tuner.cli", *args], shown), shown)


def run_process(service: Service, argv: list[str], shown: str) -> tuple[int, str, str]:
    """``python ARGV`` in the service's environment, time-boxed: a hang is a failure."""
    try:
        done = subprocess.run(
            [sys.executable, *argv],
            env=service.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise Failure(shown, f"timed out after {COMMAND_TIMEOUT_S} s") from None
    return done.returncode, done.stdout, done.stderr


class Failure(Exception):
    """A path failed: the command as typed and the line that says why."""

    def __init__(self, command: str, line: str) -> None:
        super().__init__(line)
        self.command, self.line = command, line


def run_json(service: Service, args: list[str]) -> tuple[dict[str, Any], str]:
    """Run a ``--json`` command: its document and the command as typed, or a Failure."""
    code, out, err, shown = tuner(service, args)
    if code != 0:
        raise Failure(shown, f"exit {code}: {last_line(err or out)}")
    try:
        document: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError as exc:
        raise Failure(shown, f"stdout is not one JSON object: {exc}") from None
    return document, shown


def check_profile(service: Service, run: Run) -> Cell:
    b = run.arch.global_batch_size
    args = ["profile", *run.profile_args(), "--global-batch-size", str(b), "--json"]
    document, shown = run_json(service, args)
    run.document = run.printed["profile"] = document
    found = document.get("max_micro_batch_size")
    split = (document.get("recommendation") or {}).get("split") or []  # runs [size, count]
    if not found or sum(size * count for size, count in split) != b:
        raise Failure(shown, f"M* {found}, split {split} does not make {b}")
    return Cell("pass", f"M* {found}, {len(document['probes'])} probes")


def check_json(service: Service, run: Run) -> Cell:
    if not run.printed:
        return Cell("n.a.", "no --json document (the commands failed)")
    refused = []
    for label, document in run.printed.items():
        response = httpx.post(
            f"{service.url}/api/v1/profiles",
            json=document,
            headers={"Authorization": f"Bearer {service.token}"},
            timeout=30,
        )
        if response.status_code >= 300:
            try:
                detail = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                detail = response.text.replace("\n", " ")[:300]
            refused.append(f"{label}: HTTP {response.status_code}: {detail}")
    if refused:
        command = "tuner profile ... --json | POST /api/v1/profiles"
        line = f"{len(refused)} of {len(run.printed)} refused; {refused[0]}"
        if len(refused) > 1:
            line += f" (also {', '.join(r.split(':')[0] for r in refused[1:])})"
        raise Failure(command, line)
    return Cell("pass", f"{len(run.printed)} posted")


def check_seq_lens(service: Service, run: Run) -> Cell:
    lengths = run.arch.seq_lens
    if lengths is None:
        return Cell("n.a.", "the factory takes no seq_len")
    args = ["profile", *run.profile_args(without="seq_len"), "--seq-lens", lengths, "--json"]
    document, shown = run_json(service, args)
    profiles = document.get("profiles") or []
    for length, member in zip(lengths.split(","), profiles, strict=False):
        run.printed[f"--seq-lens profile {length}"] = member
    found = [p.get("max_micro_batch_size") for p in profiles]
    if len(found) != len(lengths.split(",")) or not all(found):
        raise Failure(shown, f"the profiles' M*: {found}")
    probes = [len(p.get("probes") or []) for p in profiles]
    run.estimates = left_out_estimates([int(n) for n in lengths.split(",")], profiles)
    if any(e is not None and e > true for _, e, true in run.estimates):
        raise Failure(shown, f"an estimate above the measured M*: {run.estimates}")
    shown_estimates = ", ".join(
        f"{length}: {'refused' if e is None else e}" for length, e, _ in run.estimates
    )
    return Cell(
        "pass",
        f"M* {'/'.join(map(str, found))}, probes {'/'.join(map(str, probes))}; "
        f"left out: {shown_estimates}",
    )


def left_out_estimates(
    lengths: list[int], printed: list[dict[str, Any]]
) -> list[tuple[int, int | None, int]]:
    """Each length estimated from the profiles of the others: ``(length, estimate or None
    where refused, measured M*)``."""
    from tuner.core.errors import BadInputError
    from tuner.core.lengths import estimate_length
    from tuner.core.results import Profile

    profiles = [
        Profile.model_validate({k: v for k, v in p.items() if k in Profile.model_fields})
        for p in printed
    ]
    found: list[tuple[int, int | None, int]] = []
    for index, length in enumerate(lengths):
        others = [i for i in range(len(lengths)) if i != index]
        try:
            estimate: int | None = estimate_length(
                [profiles[i] for i in others], [lengths[i] for i in others], length
            ).max_micro_batch_size
        except BadInputError as refusal:
            estimate = None
            if "too far" not in str(refusal):  # the others: why, on stderr
                print(f"{length} refused: {refusal}", file=sys.stderr)
        found.append((length, estimate, profiles[index].max_micro_batch_size))
    return found


def estimates_summary(runs: list[Run]) -> str:
    """The left-out estimates over the corpus: answered, refused, equal, never above, and
    the worst shortfall."""
    cases = [c for run in runs for c in run.estimates]
    answered = [(e, true) for _, e, true in cases if e is not None]
    if not cases:
        return ""
    above = sum(e > true for e, true in answered)
    equal = sum(e == true for e, true in answered)
    worst = max(((true - e) / true for e, true in answered if true), default=0.0)
    return (
        f"Each --seq-lens length left out and estimated from the other two: "
        f"{len(answered)} answered, {len(cases) - len(answered)} refused; {above} above the "
        f"measured M*, {equal} of {len(answered)} equal to it"
        + (f" ({equal / len(answered):.0%})" if answered else "")
        + f", worst shortfall {worst:.0%}"
    )


def check_parallel(mode: str) -> Callable[[Service, Run], Cell]:
    def check(service: Service, run: Run) -> Cell:
        b = run.arch.global_batch_size
        args = ["profile", *run.profile_args(), "--world-size", "2", "--parallel", mode,
                "--global-batch-size", str(b), "--json"]  # fmt: skip
        document, shown = run_json(service, args)
        run.printed[f"--parallel {mode}"] = document
        found = document.get("max_micro_batch_size")
        if not found:
            raise Failure(shown, f"M* {found}")
        return Cell("pass", f"M* {found}, {len(document['probes'])} probes")

    return check


def check_mesh(*, world_size: int, fake: bool) -> Callable[[Service, Run], Cell]:
    """FSDP × tensor parallelism by the named Llama plan, as a (world/2) × 2 mesh: on real
    ranks, or one rank of a larger world standing for it in one process."""

    def check(service: Service, run: Run) -> Cell:
        if not run.arch.target.startswith("tuner.hf:"):
            return Cell("n.a.", "not a transformers model: a plan of its own is needed")
        b = run.arch.global_batch_size
        args = ["profile", *run.profile_args(), "--world-size", str(world_size), "--tp", "2",
                "--parallel", "fsdp", "--parallel-option", "tp_plan=llama",
                *(["--fake-world"] if fake else []), "--global-batch-size", str(b * world_size),
                "--json"]  # fmt: skip
        code, out, err, shown = tuner(service, args)
        if code != 0 and NO_LLAMA_BLOCK in err:
            return Cell("n.a.", "no Llama-like block (refused in one line)")
        if code != 0:
            raise Failure(shown, f"exit {code}: {last_line(err or out)}")
        document: dict[str, Any] = json.loads(out)
        run.printed["--fake-world" if fake else "--tp 2"] = document
        found = document.get("max_micro_batch_size")
        if not found or document.get("settings", {}).get("simulated_ranks") is not fake:
            raise Failure(shown, f"M* {found}, simulated {document.get('settings')}")
        return Cell("pass", f"M* {found}, {len(document['probes'])} probes")

    return check


def check_explore(service: Service, run: Run) -> Cell:
    if not run.arch.variants:
        return Cell("n.a.", "declares no variants")
    b = run.arch.global_batch_size
    args = ["profile", *run.profile_args(), "--explore", "--global-batch-size", str(b), "--json"]
    document, shown = run_json(service, args)
    run.printed["--explore"] = document
    variants = document.get("variants") or []
    chosen = [v for v in variants if v.get("chosen")]
    if len(variants) < 2 or len(chosen) != 1:
        raise Failure(shown, f"{len(variants)} variants, {len(chosen)} chosen")
    return Cell("pass", f"{len(variants)} variants")


def check_upload(service: Service, run: Run) -> Cell:
    b = run.arch.global_batch_size
    args = ["profile", *run.profile_args(), "--global-batch-size", str(b), "--upload"]
    code, out, err, shown = tuner(service, args)
    if code != 0:
        raise Failure(shown, f"exit {code}: {last_line(err or out)}")
    return Cell("pass")


def check_recommend(service: Service, run: Run) -> Cell:
    if run.document is None:
        return Cell("n.a.", "no names to ask with (profile failed)")
    workload = run.document["workload"]["name"]
    device = run.document["device"]["name"]
    b = run.arch.global_batch_size
    args = ["recommend", "--workload", workload, "--device", device,
            "--global-batch-size", str(b), "--json"]  # fmt: skip
    answer, _ = run_json(service, args)
    run.answer = answer
    return Cell("pass", f"{answer['micro_batch_size']} × {answer['grad_accum']}")


# Three optimizer steps with a plan, in a process of their own as a training script is.
_TRAIN = """
import json, math, sys, warnings
import torch
from tuner import Accumulator, load_workload
from tuner.core.plan import expand
from tuner.engine.workload import parse_options
target, pairs, plan, b = json.loads(sys.argv[1])
warnings.simplefilter("ignore")  # BatchNorm's warning under accumulation is the point of it
workload = load_workload(target, parse_options(pairs))  # as `-o NAME=VALUE` is read
accumulator = Accumulator.for_workload(workload, plan["micro_batch_size"], split=plan["split"])
for step in range(3):
    torch.manual_seed(step)
    report = accumulator.step_samples(b)  # each micro batch made as it is reached
    if not math.isfinite(report.loss) or list(report.split) != expand(plan["split"]):
        sys.exit(f"step {step}: loss {report.loss}, split {list(report.split)}")
print(report.loss)
"""


def check_train(service: Service, run: Run) -> Cell:
    plan, source = run.answer, "answer"
    if plan is None and run.document is not None:
        plan, source = run.document.get("recommendation"), "profile's plan"
    if plan is None:
        return Cell("n.a.", "no plan (profile and recommend failed)")
    pairs = [f"{name}={value}" for name, value in run.options.items()]
    payload = json.dumps([run.arch.target, pairs, plan, run.arch.global_batch_size])
    shown = f"3 accumulating steps with the {source}"
    code, out, err = run_process(service, ["-c", _TRAIN, payload], shown)
    if code != 0:
        raise Failure(shown, last_line(err))
    loss = float(out.strip().splitlines()[-1])
    from tuner.core.plan import format_runs  # torch-free; the split travels as runs

    split = format_runs(plan["split"])
    note = f"{split}, loss {loss:.2f}"
    return Cell("pass", note if source == "answer" else f"{note} (with the {source})")


CHECKS: dict[str, Callable[[Service, Run], Cell]] = {
    "profile": check_profile,
    "seq-lens": check_seq_lens,
    "ddp": check_parallel("ddp"),
    "fsdp": check_parallel("fsdp"),
    "mesh": check_mesh(world_size=2, fake=False),
    "fake-world": check_mesh(world_size=64, fake=True),
    "explore": check_explore,
    "json": check_json,
    "upload": check_upload,
    "recommend": check_recommend,
    "train": check_train,
}


def factory_options(arch: Architecture, configs: Path) -> dict[str, str]:
    """The ``-o`` options, with a transformers config written to a file as a user has it."""
    from bench.corpus_models import HF_CONFIGS

    options = dict(option.split("=", 1) for option in arch.options)
    if arch.config is not None:
        path = configs / f"{arch.config}.json"
        path.write_text(json.dumps(HF_CONFIGS[arch.config]))
        options = {"config": str(path), **options}
    return options


def run_architecture(service: Service, arch: Architecture, paths: list[str], configs: Path) -> Run:
    """Every path of one architecture, in order: later paths use what earlier ones printed."""
    run = Run(arch, factory_options(arch, configs))
    for path in paths:
        started = time.monotonic()
        try:
            cell = CHECKS[path](service, run)
        except Failure as failure:
            cell = Cell("FAIL", command=failure.command, line=failure.line)
        except Exception as exc:  # a broken expectation of this script: a failure too
            line = f"{type(exc).__name__}: {exc}"
            cell = Cell("FAIL", command=f"bench/corpus.py {path}", line=line)
        cell.seconds = time.monotonic() - started
        run.cells[path] = cell
        mark = cell.note if cell.status == "pass" else cell.line or cell.note
        print(
            f"{arch.name:>10} {path:>9} {cell.status:>4} {cell.seconds:5.1f}s  {mark}", flush=True
        )
    return run


def run_corpus(
    architectures: list[Architecture],
    paths: list[str],
    workdir: Path,
    *,
    jobs: int = 1,
    done: Callable[[list[Run]], None] = lambda runs: None,
) -> list[Run]:
    """Each architecture's paths against one service, ``jobs`` architectures at a time (the
    work is in subprocesses, so threads suffice); ``done`` sees the runs finished so far, in
    the corpus's order, after each one."""
    service = Service(workdir)
    configs = workdir / "configs"
    configs.mkdir()
    finished: dict[str, Run] = {}
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [
                pool.submit(run_architecture, service, arch, paths, configs)
                for arch in architectures
            ]
            for future in as_completed(futures):
                run = future.result()
                finished[run.arch.name] = run
                done([finished[a.name] for a in architectures if a.name in finished])
    finally:
        service.stop()
    return [finished[a.name] for a in architectures]


def report(runs: list[Run], paths: list[str]) -> tuple[str, str]:
    """The table (with footnote numbers for failures) and the failing lines under it."""
    from bench.common import markdown_table

    failures: list[str] = []
    rows = []
    for run in runs:
        row = [run.arch.name, run.arch.family]
        for path in paths:
            cell = run.cells[path]
            if cell.status == "FAIL":
                failures.append(
                    f"{len(failures) + 1}. {run.arch.name} {path}: `{cell.command}` → {cell.line}"
                )
                row.append(f"**FAIL** ({len(failures)})")
            elif cell.status == "n.a.":
                row.append(f"n.a.: {cell.note}")
            else:
                row.append(f"pass: {cell.note}" if cell.note else "pass")
        rows.append(row)
    return markdown_table(["model", "family", *paths], rows), "\n".join(failures)


def main() -> None:
    global COMMAND_TIMEOUT_S
    from bench.common import write_section

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every path on the LSTM; no write")
    parser.add_argument("--only", default=None, help="architectures, comma-separated")
    parser.add_argument("--paths", default=None, help=f"of {', '.join(PATHS)}")
    parser.add_argument(
        "--timeout", type=int, default=COMMAND_TIMEOUT_S, help="seconds a command may take"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="models at a time (default 1; each runs its own "
        "subprocesses, two ranks under ddp and fsdp)",
    )
    args = parser.parse_args()
    COMMAND_TIMEOUT_S = args.timeout
    load = os.getloadavg()[0]  # on a shared machine, minutes mean little without it
    names = args.only.split(",") if args.only else (["lstm"] if args.quick else None)
    by_name = {arch.name: arch for arch in CORPUS}
    unknown = sorted(set(names or ()) - set(by_name))
    paths = args.paths.split(",") if args.paths else list(PATHS)
    unknown += sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(
            f"unknown {', '.join(unknown)}: architectures {', '.join(by_name)}; "
            f"paths {', '.join(PATHS)}"
        )
    architectures = [by_name[n] for n in names] if names else list(CORPUS)
    record = not (args.quick or args.only or args.paths)  # only the whole corpus is the record
    started = time.monotonic()

    def summarise(runs: list[Run]) -> tuple[str, str, str, int]:
        table, failures = report(runs, paths)
        cells = [c for run in runs for c in run.cells.values()]
        counts = {s: sum(c.status == s for c in cells) for s in ("pass", "FAIL", "n.a.")}
        minutes = (time.monotonic() - started) / 60
        summary = (
            f"{counts['pass']} pass, {counts['FAIL']} fail, {counts['n.a.']} n.a. "
            f"in {minutes:.1f} min"
        )
        if len(runs) < len(architectures):
            summary += f" (partial: {len(runs)} of {len(architectures)} models so far)"
        return table, failures, summary, counts["FAIL"]

    def write_so_far(runs: list[Run]) -> None:
        # Rewritten after every model, so that an interrupted run keeps what it measured.
        if record:
            table, failures, summary, _ = summarise(runs)
            write_section(
                SECTION,
                _section(
                    table,
                    failures,
                    f"{summary}, {args.jobs} at a time, load average {load:.1f} at the start",
                    estimates_summary(runs),
                ),
            )

    with tempfile.TemporaryDirectory(prefix="corpus-") as workdir:
        runs = run_corpus(architectures, paths, Path(workdir), jobs=args.jobs, done=write_so_far)
    table, failures, summary, failed = summarise(runs)
    print(f"\n{table}\n\n{failures}\n\n{summary}\n{estimates_summary(runs)}")
    if failed:
        sys.exit(1)


def _section(table: str, failures: str, summary: str, estimates: str) -> str:
    from bench.common import machine_line

    # One line of prose and the failures only where there are any: the file keeps every
    # benchmark's current result in 300 lines, and this table grows with the corpus.
    lead = (
        f"{machine_line()}. {summary}{'' if failures else ', no failures'}. Each cell is one "
        "`tuner` command (or three accumulating steps) on a model from "
        "`bench/corpus_models.py` (tiny configs of transformers families, ResNet- and "
        "MobileNet-style CNNs written here because torchvision's wheel for this torch does "
        "not load on its CPU build, an LSTM language model), against a `tuner serve` on "
        "127.0.0.1 with a temporary SQLite store; CPU, each at its own `--memory-limit`."
        + (f" {estimates} (the seq-lens cells list them: length: estimate)." if estimates else "")
    )
    body = f"{table}\n\n{failures}" if failures else table
    return f"""## A corpus of models the project was not written around (`bench/corpus.py`)

{lead}

{body}
"""


if __name__ == "__main__":
    main()
