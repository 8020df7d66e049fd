"""What a profile costs: its seconds against the sum of its training steps, part by part.

Each path profiles a real workload in a fresh process of its own (as ``tuner profile``
does), with timers wrapped around the engine's functions from here (nothing in the
product prints or times for this): the Quickstart's GPT in one process at 512 MiB for a
global batch of 256, a transformers config (Qwen2, two layers of width 64), DDP and FSDP
on 2 gloo ranks, and one process standing for rank 0 of a 32 × 2 mesh (``--fake-world``).

A profile's wall time is split, each second counted once (in the innermost part running):

- process start: the interpreter and its imports (torch's), before the profile starts;
- model build (``load_workload``) and the prober's set-up (moving, wrapping the model,
  building its optimizer);
- rank launch: starting the rank processes until every one is set up, and rank stop:
  ending them (ranks only);
- dry run: building the fake replica and its predicted probes;
- the probes' steps: the warm-up steps and the measured step (both tracked), and the
  untracked step timed as training runs it; the tracking's cost is the tracked steps'
  time less as many untracked steps of the same probe;
- the speed timing after ``M*`` (``Profile.speeds``): its warm-up round and its rounds;
- the rest: the search, each probe's batch and bookkeeping, putting state back, the
  coordinator's waiting on ranks beyond rank 0's own probe.

The reference is the sum of the profile's training steps: every probe's ``steps_run``
times its untracked ``step_time_s``, what those steps cost in training. The ratio of the
wall time to it is the overhead (a cut that runs fewer steps lowers both: compare the
seconds). On ranks the steps are rank 0's (timers in each rank process write their
figures to a folder this process reads). The same parts are also given in CPU seconds,
every thread of the process and of its ranks (the ranks' own start is in the rest): on a
machine busy with other work they move far less than wall seconds.

With the fake world the guard's row holds the probe run under the guard: a probe of its
own before the search until this change, the search's first probe since.

``--before PATH`` runs every path also on the tree at ``PATH`` (a checkout of an earlier
commit), alternating with this tree, and checks that ``M*`` and every probe's peaks are
the same byte for byte in both: the cuts must not change a result.

    python bench/profile_cost.py [--repeats 2] [--before ../main] [--quick] [--threads 1]
                                 [--paths GPT,DDP] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCRIPT_STARTED = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
RANK_FOLDER_VARIABLE = "PROFILE_COST_RANK_FOLDER"

MiB = 2**20
# A transformers config of bench/corpus_models.py (two layers of width 64), by its name.
QWEN2 = "qwen2"
# bench/distributed.py's GPT: parameter-heavy for its size, where DDP's buckets weigh.
RANKS_GPT = {"layers": 4, "dim": 128, "heads": 4, "vocab": 8192, "seq_len": 16}
QUICK_GPT = {"layers": 1, "dim": 64, "heads": 2, "vocab": 2048, "seq_len": 8}

# name: (target, options, memory limit, per-rank batch or None, mode, world size, tp)
PATHS: dict[str, dict[str, Any]] = {
    "one process (GPT)": {
        "target": "examples.gpt:workload",
        "options": {},
        "limit": 512 * MiB,
        "batch": 256,
        "quick": {"options": QUICK_GPT, "limit": 8 * MiB, "batch": 64},
    },
    "one process (Qwen2)": {
        "target": "tuner.hf:causal_lm",
        "options": {"config": QWEN2, "seq_len": 32},
        "limit": 8 * MiB,
        "batch": 32,
        "quick": {},
    },
    "DDP, 2 gloo ranks": {
        "target": "examples.gpt:workload",
        "options": RANKS_GPT,
        "limit": 64 * MiB,
        "mode": "ddp",
        "world": 2,
        "quick": {"options": QUICK_GPT, "limit": 8 * MiB},
    },
    "FSDP, 2 gloo ranks": {
        "target": "examples.gpt:workload",
        "options": RANKS_GPT,
        "limit": 64 * MiB,
        "mode": "fsdp",
        "world": 2,
        "quick": {"options": QUICK_GPT, "limit": 8 * MiB},
    },
    "fake world 32 × 2 (Qwen2)": {
        "target": "tuner.hf:causal_lm",
        "options": {"config": QWEN2, "seq_len": 32},
        "limit": 8 * MiB,
        "mode": "fsdp",
        "world": 64,
        "tp": 2,
        "fake": True,
        "quick": {},
    },
}

GUARD = "fake world: the value-guard probe"
# The parts of a profile's wall time, in the order they are shown.
PARTS = (
    "process start",
    "model build",
    "rank launch",
    "rank stop",
    "dry run",
    "warm-up steps (tracked)",
    "measured steps (tracked)",
    "untracked timed steps",
    "speed timing: warm-up round",
    "speed timing: rounds",
    GUARD,
    "rest",
)


class Clock:
    """Seconds by part, each counted once: a part's time excludes the parts inside it.
    Wall seconds, and the process's CPU seconds (every thread's), which a machine busy
    with other work inflates far less."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self._stack: list[list[Any]] = []  # [part, wall since, CPU since]
        # Per probe (in order): its size and each step's part, wall and CPU seconds.
        self.probes: list[dict[str, Any]] = []

    def enter(self, name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        if self._stack:
            self.seconds[self._stack[-1][0]] += wall - self._stack[-1][1]
            self.cpu[self._stack[-1][0]] += cpu - self._stack[-1][2]
        self._stack.append([name, wall, cpu])

    def leave(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        finished, wall_since, cpu_since = self._stack.pop()
        self.seconds[finished] += wall - wall_since
        self.cpu[finished] += cpu - cpu_since
        if self._stack:
            self._stack[-1][1:] = [wall, cpu]

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.leave()

    @property
    def inside(self) -> list[str]:
        return [entry[0] for entry in self._stack]


def _wrap(owner: Any, name: str, around: Callable[..., Any]) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return around(original, *args, **kwargs)

    setattr(owner, name, wrapped)


def instrument(clock: Clock) -> None:
    """Wrap the engine's functions so that ``clock`` reads where a profile's time goes."""
    from tuner.engine import dry_run, fake_world, launch, probe

    def timed(part: str) -> Callable[..., Any]:
        def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            with clock.part(part):
                return original(*args, **kwargs)

        return around

    def prober_init(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        with clock.part("dry run" if "dry run" in clock.inside else "model build"):
            return original(self, *args, **kwargs)

    def probe_call(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        dry = isinstance(self, dry_run._DryProber)
        if not dry:
            self._cost_steps = []
        with clock.part("dry run" if dry else "rest"):
            result = original(self, *args, **kwargs)
        if not dry:
            clock.probes.append({"size": result.micro_batch_size, "steps": self._cost_steps})
        return result

    def step(
        original: Callable[..., Any],
        self: Any,
        batch: Any,
        scaler: Any,
        measure: Any = None,
    ) -> Any:
        if isinstance(self, dry_run._DryProber):
            return original(self, batch, scaler, measure)
        steps = self._cost_steps
        if measure is not None:
            kind = "measured steps (tracked)"
        elif getattr(self.backend, "_tracker", None) is not None:
            kind = "warm-up steps (tracked)"
        else:
            kind = "untracked timed steps"
        wall, cpu = time.perf_counter(), time.process_time()
        with clock.part(GUARD if GUARD in clock.inside else kind):
            result = original(self, batch, scaler, measure)
        steps.append((kind, time.perf_counter() - wall, time.process_time() - cpu))
        return result

    def time_sizes(original: Callable[..., Any], self: Any, sizes: list[int], **kwargs: Any) -> Any:
        self._cost_warm = len(sizes)
        with clock.part("speed timing: rounds"):
            return original(self, sizes, **kwargs)

    def accumulate_step(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("clock") is None or not getattr(self, "_cost_warm", 0):
            return original(self, *args, **kwargs)
        self._cost_warm -= 1
        with clock.part("speed timing: warm-up round"):
            return original(self, *args, **kwargs)

    _wrap(probe.Prober, "__init__", prober_init)
    _wrap(probe.Prober, "__call__", probe_call)
    _wrap(probe.Prober, "_step", step)
    _wrap(probe.Prober, "time_sizes", time_sizes)
    _wrap(probe.Prober, "_accumulate_step", accumulate_step)
    _wrap(dry_run.DryRun, "__init__", timed("dry run"))
    _wrap(dry_run.DryRun, "__call__", timed("dry run"))
    _wrap(dry_run, "load_workload", timed("dry run"))
    for name in ("start", "spawn", "wait_ready"):  # the last two where start is split
        if hasattr(launch.RankGroup, name):
            _wrap(launch.RankGroup, name, timed("rank launch"))
    _wrap(launch.RankGroup, "stop", timed("rank stop"))
    setattr(launch, "rank_main", timed_rank_main)  # noqa: B010  (the rank processes start it)
    guard = fake_world.CollectiveValueGuard

    def guard_enter(original: Callable[..., Any], self: Any) -> Any:
        clock.enter(GUARD)
        return original(self)

    def guard_exit(original: Callable[..., Any], self: Any, *exc_info: Any) -> Any:
        try:
            return original(self, *exc_info)
        finally:
            clock.leave()

    _wrap(guard, "__enter__", guard_enter)
    _wrap(guard, "__exit__", guard_exit)


def timed_rank_main(rank: int, request: Any, conn: Any) -> None:
    """A rank as the engine runs it, with its parts timed and written after every probe."""
    from tuner.engine import probe
    from tuner.engine import rank as rank_module

    clock = Clock()
    instrument(clock)
    folder = Path(os.environ[RANK_FOLDER_VARIABLE])

    def probe_and_write(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        document = {
            "rank": rank,
            "seconds": clock.seconds,
            "cpu": clock.cpu,
            "probes": clock.probes,
        }
        (folder / f"rank-{rank}-{os.getpid()}.json").write_text(json.dumps(document))
        return result

    _wrap(probe.Prober, "__call__", probe_and_write)
    rank_module.rank_main(rank, request, conn)


def run_path(name: str, quick: bool) -> dict[str, Any]:
    """Profile one path in this process, instrumented; its figures as a document."""
    spec = {**PATHS[name], **(PATHS[name]["quick"] if quick else {})}
    clock = Clock()
    with clock.part("process start"):
        import torch  # noqa: F401  (the imports a profile's process makes first)

        from tuner.core.parallel import Parallel
        from tuner.engine.backends import CpuBackend
        from tuner.engine.profiler import profile_workload
        from tuner.engine.workload import load_workload
    # From the script's first line: its own imports count too.
    clock.seconds["process start"] = time.perf_counter() - SCRIPT_STARTED
    clock.cpu["process start"] = time.process_time()
    instrument(clock)
    rank_folder = tempfile.mkdtemp(prefix="profile-cost-")
    os.environ[RANK_FOLDER_VARIABLE] = rank_folder
    started = time.perf_counter()
    with clock.part("rest"):
        with clock.part("model build"):
            workload = load_workload(spec["target"], _resolved(spec["options"]))
        if spec.get("mode"):
            workload.parallel = Parallel(
                mode=spec["mode"],
                tp=spec.get("tp", 1),
                tp_plan="llama" if spec.get("tp", 1) > 1 else None,
            )
        profile = profile_workload(
            workload,
            CpuBackend(spec["limit"]),
            world_size=spec.get("world", 1),
            fake_world=spec.get("fake", False),
            per_rank_batch_size=spec.get("batch"),
        )
    profile_s = time.perf_counter() - started
    ranks = _rank_documents(Path(rank_folder))
    seconds, cpu = dict(clock.seconds), dict(clock.cpu)
    probes_steps = clock.probes
    for index, rank in enumerate(ranks):
        # Every rank's CPU counts; for wall time rank 0's steps stand for the ranks' (they
        # run at once), and the coordinator's wait beyond them stays in "rest".
        for part, value in rank["cpu"].items():
            cpu[part] = cpu.get(part, 0.0) + value
        if index == 0:
            probes_steps = rank["probes"]
            for part, value in rank["seconds"].items():
                if part not in ("rest", "model build"):
                    seconds[part] = seconds.get(part, 0.0) + value
                    seconds["rest"] -= value
    every_probe = [p for rank in ranks for p in rank["probes"]] or clock.probes
    return {
        "path": name,
        "profile_s": profile_s,
        "seconds": seconds,
        "cpu": cpu,
        "tracking_s": _tracking_seconds(probes_steps, 1),
        "tracking_cpu_s": _tracking_seconds(every_probe, 2),
        "training_steps_s": sum(
            (p.steps_run or 0) * (p.step_time_s or 0.0) for p in profile.probes
        ),
        "training_steps_cpu_s": _training_steps_cpu(profile.probes, every_probe),
        "max_micro_batch_size": profile.max_micro_batch_size,
        "peaks": [
            [p.micro_batch_size, p.peak_allocated_bytes, p.peak_reserved_bytes, p.fits]
            for p in profile.probes
        ],
        "probes": len(profile.probes),
        "steps": sum(p.steps_run or 0 for p in profile.probes),
        "speed_sizes": [s.micro_batch_size for s in profile.speeds.sizes] if profile.speeds else [],
    }


def _resolved(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with a config named by its key in ``HF_CONFIGS`` replaced by the config."""
    from bench.corpus_models import HF_CONFIGS

    config = options.get("config")
    return {**options, "config": HF_CONFIGS[config]} if isinstance(config, str) else options


def _rank_documents(folder: Path) -> list[dict[str, Any]]:
    """Each rank's figures, summed over the processes it ran in (restarts), by rank."""
    by_rank: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("rank-*.json")):
        document = json.loads(path.read_text())
        into = by_rank.setdefault(
            document["rank"], {"seconds": defaultdict(float), "cpu": defaultdict(float)}
        )
        for part, value in document["seconds"].items():
            into["seconds"][part] += value
        for part, value in document["cpu"].items():
            into["cpu"][part] += value
        into.setdefault("probes", []).extend(document["probes"])
    return [by_rank[rank] for rank in sorted(by_rank)]


UNTRACKED = "untracked timed steps"


def _tracking_seconds(probes: list[dict[str, Any]], column: int) -> float:
    """Tracked steps' seconds less as many untracked steps of the same probe (``column``
    1: wall seconds, 2: CPU seconds)."""
    total = 0.0
    for probe in probes:
        untracked = [step[column] for step in probe["steps"] if step[0] == UNTRACKED]
        if not untracked:
            continue
        tracked = [step[column] for step in probe["steps"] if step[0] != UNTRACKED]
        total += sum(tracked) - len(tracked) * min(untracked)
    return total


def _training_steps_cpu(results: list[Any], probes: list[dict[str, Any]]) -> float:
    """CPU seconds of the profile's steps as training runs them: each probe's steps, on
    every rank, at the CPU seconds of its untracked step."""
    total = 0.0
    for result in results:
        for probe in probes:
            untracked = [step[2] for step in probe["steps"] if step[0] == UNTRACKED]
            if probe["size"] == result.micro_batch_size and untracked:
                total += len(probe["steps"]) * min(untracked)
    return total


def run_in_process(
    python: str, tree: Path, name: str, quick: bool, threads: int | None = None
) -> dict[str, Any]:
    """``run_path`` in a fresh process importing the product from ``tree`` (with
    ``threads`` torch threads in the profiling process, where given)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    argv = [python, str(Path(__file__).resolve()), "--worker", name]
    argv += ["--quick"] if quick else []
    started, used = time.perf_counter(), _children_cpu()
    done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - started, _children_cpu() - used
    if done.returncode != 0:
        raise SystemExit(f"{name} failed in {tree}:\n{done.stderr[-3000:]}")
    document: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    document["wall_s"] = wall
    inside = document["profile_s"] + sum(
        v for k, v in document["seconds"].items() if k == "process start"
    )
    # The interpreter's own start, before the script ran, counts as process start too.
    document["seconds"]["process start"] += max(0.0, wall - inside)
    # CPU seconds of the process and its ranks; what no part counted is the rest's.
    document["cpu_s"] = cpu
    document["cpu"]["rest"] = cpu - sum(v for k, v in document["cpu"].items() if k != "rest")
    return document


def _children_cpu() -> float:
    """CPU seconds of every finished child process (and theirs, waited for by them)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


ROWS: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
    ("profile, s (wall of its process)", lambda d: d["wall_s"]),
    ("sum of its training steps, s", lambda d: d["training_steps_s"]),
    ("ratio (the overhead)", lambda d: d["wall_s"] / max(d["training_steps_s"], 1e-9)),
    *((f"{part}, s", lambda d, part=part: d["seconds"].get(part, 0.0)) for part in PARTS),
    ("of the tracked steps: tracking, s", lambda d: d["tracking_s"]),
]
CPU_ROWS: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
    ("profile, CPU s (its process and ranks)", lambda d: d["cpu_s"]),
    ("sum of its training steps, CPU s", lambda d: d["training_steps_cpu_s"]),
    ("ratio (the overhead)", lambda d: d["cpu_s"] / max(d["training_steps_cpu_s"], 1e-9)),
    *((f"{part}, CPU s", lambda d, part=part: d["cpu"].get(part, 0.0)) for part in PARTS),
    ("of the tracked steps: tracking, CPU s", lambda d: d["tracking_cpu_s"]),
]


def report(runs: dict[str, dict[str, list[dict[str, Any]]]], trees: list[str]) -> str:
    """One table per tree: a column per path, a row per part, medians (and range)."""
    from bench.common import markdown_table

    tables = []
    for tree in trees:
        names = [name for name in runs if runs[name].get(tree)]
        for kind, chosen in (("wall seconds", ROWS), ("CPU seconds", CPU_ROWS)):
            rows = [
                [label, *(_spread([value(d) for d in runs[n][tree]]) for n in names)]
                for label, value in chosen
            ]
            rows.append(["probes / steps / M*", *(_counts(runs[n][tree][0]) for n in names)])
            tables.append(f"{tree}, {kind}:\n\n" + markdown_table(["", *names], rows))
    return "\n\n".join(tables)


def _counts(document: dict[str, Any]) -> str:
    return f"{document['probes']} / {document['steps']} / {document['max_micro_batch_size']}"


def check_same_results(
    runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> tuple[list[str], list[str]]:
    """Paths whose ``M*`` or peaks differ between the trees, and paths whose results vary
    from run to run within one tree (no change to blame: FSDP on gloo, where a collective's
    temporaries are alive at the peak or not by the worker threads' timing)."""
    differing, unrepeatable = [], []
    for name, by_tree in runs.items():
        results = {
            tree: {json.dumps([d["max_micro_batch_size"], d["peaks"]]) for d in documents}
            for tree, documents in by_tree.items()
        }
        if any(len(found) > 1 for found in results.values()):
            unrepeatable.append(
                f"{name}: "
                + "; ".join(
                    f"{tree}: M* {sorted(json.loads(r)[0] for r in found)}"
                    for tree, found in results.items()
                )
            )
        elif len({next(iter(found)) for found in results.values()}) > 1:
            differing.append(f"{name}: {results}")
    return differing, unrepeatable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--paths", help="comma-separated names of paths (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller models; writes nothing")
    parser.add_argument("--no-write", action="store_true", help="print only (it always does)")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads of the profiling process (default torch's); on a machine "
        "busy with other work, 1: spinning threads waiting for a descheduled one slowed "
        "a small model's steps 50-fold here, in wall and CPU seconds alike",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_path(args.worker, args.quick)))
        return
    names = list(PATHS)
    if args.paths:
        names = [n for n in PATHS if any(p.strip() in n for p in args.paths.split(","))]
    trees = {"this tree": ROOT}
    if args.before:
        trees = {"before": args.before.resolve(), "after": ROOT}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {n: defaultdict(list) for n in names}
    for repeat in range(args.repeats):
        for name in names:
            for label, tree in trees.items():
                document = run_in_process(sys.executable, tree, name, args.quick, args.threads)
                runs[name][label].append(document)
                print(
                    f"[{repeat + 1}/{args.repeats}] {name}, {label}: {document['wall_s']:.1f} s, "
                    f"steps {document['training_steps_s']:.1f} s, M* "
                    f"{document['max_micro_batch_size']}",
                    flush=True,
                )
    table = report(runs, list(trees))
    print(table)
    differing, unrepeatable = check_same_results(runs)
    if unrepeatable:
        print("Not repeatable within a tree (no change to blame):\n" + "\n".join(unrepeatable))
    if differing:
        print("M* or peaks differ between the trees:\n" + "\n".join(differing))
        raise SystemExit(1)
    print("M* and every probe's peaks are the same in every tree, byte for byte.")
    # It prints only: its figures, and what each cut saved, are kept in CHANGELOG.md.


if __name__ == "__main__":
    main()
