"""``tuner profile``: probe a workload and find the largest micro batch that fits."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console

from tuner.cli.commands._lengths import Lengths, check_combinations, seq_lens
from tuner.core.commands import (
    EXIT_FAILED,
    EXIT_NOTHING_FITS,
    EXIT_OK,
    headroom,
    memory,
    positive_int,
)
from tuner.core.errors import BadInputError, TunerError
from tuner.core.reports import ProfileReport, VariantSummary
from tuner.core.shape import MeshShape

if TYPE_CHECKING:
    from tuner.client import TunerClient
    from tuner.core.results import Profile
    from tuner.engine.backends import Backend
    from tuner.engine.explore import Exploration, VariantOutcome
    from tuner.engine.workload import Workload


def add_parser(commands: Any) -> None:
    profile = commands.add_parser(
        "profile",
        help="probe a workload and find the largest micro batch that fits",
        description="Probe TARGET (package.module:function returning a tuner.Workload) and "
        "find the largest micro batch size that fits the device's memory.",
    )
    profile.add_argument("target", help="package.module:function returning a tuner.Workload")
    profile.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present, else cpu)"
    )
    profile.add_argument(
        "--memory-limit",
        type=memory,
        default=None,
        help="memory to fit in, e.g. 2GiB; needed on cpu, emulates a smaller GPU on cuda",
    )
    profile.add_argument(
        "--headroom",
        type=headroom,
        default=0.05,
        help="fraction of memory kept free (default 0.05)",
    )
    profile.add_argument(
        "--strategy",
        choices=("model", "bisect"),
        default="model",
        help="model: aim with an affine fit (default); bisect: double then bisect",
    )
    profile.add_argument(
        "--max",
        dest="size_cap",
        type=positive_int,
        default=4096,
        help="largest micro batch size to consider (default 4096)",
    )
    profile.add_argument(
        "--global-batch-size",
        type=positive_int,
        default=None,
        help="samples per optimizer step across all ranks: also recommend settings",
    )
    profile.add_argument(
        "--world-size",
        type=positive_int,
        default=1,
        help="data-parallel ranks: with --parallel ddp|fsdp (or a workload that declares "
        "one) the probes run on this many ranks; otherwise the plan divides the batch by it "
        "(default 1)",
    )
    profile.add_argument(
        "--parallel",
        choices=("none", "ddp", "fsdp"),
        default=None,
        help="measure the step as it trains under DDP or FSDP on --world-size ranks (default: "
        "what the workload declares, else none: one process)",
    )
    profile.add_argument(
        "--tp",
        type=positive_int,
        default=None,
        help="with --parallel fsdp: tensor-parallel ranks in each data-parallel group; the "
        "--world-size ranks form a (world/tp) × tp mesh split by the workload's tp_plan, "
        "--parallel-option tp_plan=auto (a transformers model's own plan) or tp_plan=llama "
        "(default 1: no mesh)",
    )
    profile.add_argument(
        "--fake-world",
        action="store_true",
        help="one process stands for rank 0 of --world-size on torch's fake process group: "
        "a world larger than this machine, its memory measured (its numerics not trained)",
    )
    profile.add_argument(
        "--parallel-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a DDP or FSDP option, e.g. gradient_as_bucket_view=false, gradient_sync=last",
    )
    profile.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="keyword argument for the workload factory, e.g. -o precision=bf16",
    )
    profile.add_argument(
        "--allow-path",
        action="append",
        default=None,
        metavar="DIR",
        help="read files that options name (-o config=...) only when they are regular files "
        "under DIR, repeatable, as `tuner worker` runs profiles; with --max-file-bytes and "
        "no --allow-path, no file at all (default: any file)",
    )
    profile.add_argument(
        "--max-file-bytes",
        type=memory,
        default=None,
        help="with --allow-path: the largest file an option may name (default 4MiB)",
    )
    profile.add_argument(
        "--warmup-steps",
        type=positive_int,
        default=2,
        help="optimizer steps before measuring (default 2)",
    )
    profile.add_argument(
        "--time-splits",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after M*, time micro batches at a few sizes (the splits of --global-batch-size "
        "into the fewest and 2, 4 and 8 times as many) and answer with a split into more, "
        "smaller micro batches when it trains faster by more than the timed rounds' spread "
        "(default: on, in one process; --no-time-splits skips it)",
    )
    profile.add_argument(
        "--explore",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="profile every variant the workload declares (checkpointing, precision, ...) and "
        "pick the fastest measured for --global-batch-size; options given with -o stay fixed "
        "(default: on by itself when M* < 4 or nothing fits)",
    )
    profile.add_argument(
        "--seq-lens",
        type=seq_lens,
        default=None,
        metavar="S1,S2,...",
        help="profile at each sequence length (the factory's seq_len option), later lengths "
        "aimed by the earlier ones; stores a profile per length as one family",
    )
    profile.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout; messages go to stderr"
    )
    profile.add_argument(
        "--upload",
        action="store_true",
        help="store the profile in the service at TUNER_URL (token TUNER_TOKEN), print its id",
    )


class Measurement(Protocol):
    """What one kind of ``tuner profile`` measures, stores and prints: the workload as
    loaded (:class:`OneWorkload`, with its variants when exploring) or at several sequence
    lengths (:class:`tuner.cli.commands._lengths.Lengths`). The steps around it are
    :func:`run`'s, the same for both."""

    #: Who was not uploaded, in "{subject} not uploaded": "the profile was".
    subject: str
    #: The ranks the plan is for, known once loaded: the workload's own parallel spec may
    #: bring a tp that ``--tp`` did not give (``--parallel-option tp=2``, say).
    mesh: MeshShape

    def load(self, backend: Backend) -> None:
        """Load what is measured, before the client is made (a bad target costs nothing)."""

    def measure(self, stderr: Console) -> None:
        """Probe; an error that is not a ``TunerError`` is the workload's own."""

    def settle(self) -> list[Profile]:
        """Decide the answer from the measurements; the profiles to store."""

    def write(self, ids: list[int], *, json_output: bool) -> None:
        """Print the answer (``ids``: those of the stored profiles, empty when none)."""

    def stored(self, ids: list[int]) -> str:
        """Where the profiles went, "profile 3", for the line that says so."""

    def nothing_fits(self) -> str | None:
        """What to do when not even one sample fits; ``None`` when something does."""


def run(args: argparse.Namespace, stderr: Console) -> int:
    """The one pipeline of ``tuner profile``: refuse bad arguments before loading anything,
    make the device, load, probe, decide, upload, print, and exit with the status that says
    how it went. Files that options name are read under ``--allow-path`` when given."""
    from tuner.core.option_files import FilePolicy, restricted

    policy = None
    if args.allow_path is not None or args.max_file_bytes is not None:
        policy = FilePolicy.of(args.allow_path or (), max_bytes=args.max_file_bytes)
    with restricted(policy):
        return _run(args, stderr)


def _run(args: argparse.Namespace, stderr: Console) -> int:
    from tuner.core.plan import per_rank_batch

    check_mesh_arguments(args)
    if args.global_batch_size is not None and args.tp is not None:
        # Refused before importing torch, which alone takes a second or two. Without --tp
        # the workload may bring its own, so that waits for it to be loaded.
        per_rank_batch(args.global_batch_size, mesh_of(args))
    if args.seq_lens is not None:
        check_combinations(args)

    # torch is imported here, not at module level, so `tuner --help` stays fast.
    import torch

    from tuner.client import TunerClient
    from tuner.engine.backends import make_backend

    measurement: Measurement = Lengths(args) if args.seq_lens is not None else OneWorkload(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = make_backend(device, memory_limit_bytes=args.memory_limit)
    measurement.load(backend)
    if args.global_batch_size is not None:
        per_rank_batch(args.global_batch_size, measurement.mesh)  # before any probing
    # Made before probing, so that a missing TUNER_URL costs no profiling time.
    client = TunerClient() if args.upload else None
    try:
        measurement.measure(stderr)
    except TunerError:
        raise
    except Exception:
        return workload_failed(stderr, args.target)
    ids, upload_error = _upload(client, measurement.settle())
    measurement.write(ids, json_output=args.json)
    stored = measurement.stored(ids) if ids else None
    if not report_upload(stderr, client, stored, upload_error, measurement.subject, args.json):
        return EXIT_FAILED
    advice = measurement.nothing_fits()
    if advice is not None:
        stderr.print(advice, highlight=False, markup=False)
        return EXIT_NOTHING_FITS
    return EXIT_OK


def check_mesh_arguments(args: argparse.Namespace) -> None:
    """--tp and --fake-world: what they need and do not combine with, refused before loading."""
    mesh_of(args)  # refuses a world that is not dp × tp
    if args.tp is not None and args.parallel not in (None, "fsdp"):
        raise BadInputError(
            f"--tp needs --parallel fsdp (tensor parallelism × FSDP), not {args.parallel}"
        )
    if args.fake_world and (args.seq_lens is not None or args.explore):
        raise BadInputError(
            "--fake-world profiles one shape at a time: leave out --seq-lens and --explore"
        )
    if args.fake_world and args.device and args.device.startswith("cuda"):
        raise BadInputError(
            "--fake-world runs on the CPU's memory count (a fake world's collectives cannot "
            "run NCCL kernels); use --device cpu with --memory-limit set to the GPU's memory"
        )


def mesh_of(args: argparse.Namespace) -> MeshShape:
    """The ranks ``--world-size`` and ``--tp`` name, as ``dp × tp``."""
    return MeshShape(args.world_size, args.tp or 1)


def _upload(
    client: TunerClient | None, profiles: list[Profile]
) -> tuple[list[int], TunerError | None]:
    """Store every profile (the service compares variants and lengths); their ids, or the
    error that stopped it, after which the profiles are still printed: the probing is kept."""
    if client is None:
        return [], None
    with client:
        try:
            return [client.upload_profile(profile).id for profile in profiles], None
        except TunerError as exc:
            return [], exc


class OneWorkload:
    """The workload as loaded; with ``--explore`` (or by itself when memory is short) its
    declared variants too, and the answer is the chosen variant's."""

    subject = "the profile was"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def load(self, backend: Backend) -> None:
        from tuner.core.parallel import parse_parallel
        from tuner.engine.workload import load_workload, parse_options, with_mesh

        args = self.args
        self.backend = backend
        workload = load_workload(args.target, parse_options(args.option))
        if args.parallel is not None:
            workload.parallel = parse_parallel(
                args.parallel, args.parallel_option, workload.parallel
            )
        elif args.parallel_option:
            workload.parallel = parse_parallel(
                workload.parallel.mode, args.parallel_option, workload.parallel
            )
        workload.parallel = with_mesh(workload, args.tp)
        self.mesh = workload.parallel.mesh(args.world_size)
        if args.explore and not workload.variants:
            raise BadInputError(
                f"{args.target} declares no variants to explore: give its Workload "
                "variants={'option': [value, ...]}, or leave out --explore"
            )
        self.workload = workload

    def _profile(self, observer: Any, measured: Workload | None = None) -> Profile:
        from tuner.core.plan import per_rank_batch
        from tuner.core.results import ProbeSettings
        from tuner.engine.profiler import profile_workload

        return profile_workload(
            self.workload if measured is None else measured,
            self.backend,
            headroom=self.args.headroom,
            strategy=self.args.strategy,
            size_cap=self.args.size_cap,
            settings=ProbeSettings(warmup_steps=self.args.warmup_steps),
            observer=observer,
            world_size=self.args.world_size,
            fake_world=self.args.fake_world,
            time_speeds=self.args.time_splits,
            per_rank_batch_size=(
                per_rank_batch(self.args.global_batch_size, self.mesh)
                if self.args.global_batch_size is not None
                else None
            ),
        )

    def measure(self, stderr: Console) -> None:
        from tuner.cli.display import LiveProgress

        with LiveProgress(stderr) as progress:
            self.loaded = self._profile(progress)
        self.advice = _parallel_advice(self.loaded, self.workload, self._profile, stderr)
        self.exploration = _explore(
            self.args, self.loaded, self.workload, self.backend, self._profile, stderr
        )

    def settle(self) -> list[Profile]:
        from tuner.answer.local import answer_from
        from tuner.engine.workload import load_workload

        args, workload, exploration = self.args, self.workload, self.exploration
        profile, recommendation, advised = self.loaded, None, workload
        to_store = [profile]
        if exploration is not None:
            # The answer is the chosen variant's: its profile, plan and stored id say it,
            # everywhere (the loaded workload's when no variant fits). Its profile is marked
            # chosen, so that the store keeps a choice made from timings it never sees.
            to_store = [
                o.profile.model_copy(update={"variant_chosen": True})
                if o is exploration.chosen
                else o.profile
                for o in exploration.variants
            ]
            at = next((i for i, o in enumerate(exploration.variants) if o is exploration.chosen), 0)
            chosen = exploration.variants[at]
            profile, recommendation = to_store[at], chosen.recommendation
            if chosen.options:
                advised = load_workload(args.target, {**workload.options, **chosen.options})
        elif profile.max_micro_batch_size and args.global_batch_size is not None:
            recommendation = answer_from(
                profile, global_batch_size=args.global_batch_size, mesh=self.mesh
            )
        # The JSON (and the upload) is the chosen variant's profile; the text shows the
        # loaded workload's probes and then the variants table, which names the chosen one.
        self.shown, self.advised = (profile, advised) if args.json else (self.loaded, workload)
        self.advice += _short_memory_advice(self.shown, recommendation, self.advised)
        self.profile, self.recommendation = profile, recommendation
        self.to_store = to_store
        return self.to_store

    def _id(self, ids: list[int]) -> int | None:
        """The stored id of the profile shown (``None`` when nothing was stored)."""
        if not ids:
            return None
        return next(i for p, i in zip(self.to_store, ids, strict=True) if p is self.profile)

    def write(self, ids: list[int], *, json_output: bool) -> None:
        from tuner.cli.display import print_exploration, print_profile

        exploration = self.exploration
        if json_output:
            report = ProfileReport.of(
                self.profile,
                recommendation=self.recommendation,
                profile_id=self._id(ids),
                advice=self.advice,
                variants=[_variant_summary(o, exploration) for o in exploration.variants]
                if exploration is not None
                else None,
            )
            sys.stdout.write(json.dumps(report.document()) + "\n")
            return
        out = Console()
        # Exploring, the recommendation is the chosen variant's: the table says which.
        plan = None if exploration is not None else self.recommendation
        print_profile(out, self.shown, plan, mesh=self.mesh, advice=self.advice)
        if exploration is not None:
            print_exploration(out, exploration)

    def stored(self, ids: list[int]) -> str:
        shown = self._id(ids)
        others = [i for i in ids if i != shown]
        stored = f"profile {shown}"
        if others:
            exploration = self.exploration
            shown_as = "the chosen variant" if exploration and exploration.chosen else "as loaded"
            stored += f" ({shown_as}; the other variants as {', '.join(map(str, others))})"
        return stored

    def nothing_fits(self) -> str | None:
        from tuner.engine.profiler import nothing_fits_advice

        if self.profile.max_micro_batch_size:
            return None
        return nothing_fits_advice(self.profile, self.advised)


def report_upload(
    stderr: Console,
    client: Any,
    stored: str | None,
    error: TunerError | None,
    subject: str,
    json_output: bool,
) -> bool:
    """Say where the profiles went (``stored``: "profile 3") or that ``subject`` ("the
    profile was") was not uploaded; False when the upload failed."""
    if client is not None and stored is not None:
        (stderr if json_output else Console()).print(
            f"uploaded as {stored} to {client.url}", highlight=False, soft_wrap=True
        )
    if error is None:
        return True
    stderr.print(
        f"tuner profile: {subject} not uploaded: {error.message}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return False


def workload_failed(stderr: Console, target: str) -> int:
    """Inside ``except``: the workload's own traceback, then what to do."""
    stderr.print_exception(max_frames=20)
    stderr.print(
        f"tuner profile: {target} raised an error that is not an out-of-memory; "
        "fix the workload and run again",
        highlight=False,
        markup=False,
    )
    return EXIT_FAILED


def _short_memory_advice(profile: Profile, plan: Any, workload: Any) -> list[str]:
    """Where the peak is and what would lower it, when memory is what limits the answer:
    the global batch needs accumulation, or ``M* < 4`` (nothing fitting has its own
    message)."""
    from tuner.engine.explore import EXPLORE_BELOW
    from tuner.engine.profiler import peak_advice

    found = profile.max_micro_batch_size
    probe = profile.probe_at(found)
    if probe is None or (found >= EXPLORE_BELOW and (plan is None or plan.grad_accum == 1)):
        return []
    return peak_advice(probe, workload)


def _explore(
    args: argparse.Namespace,
    profile: Profile,
    workload: Any,
    backend: Any,
    measure: Callable[..., Profile],
    stderr: Console,
) -> Exploration | None:
    """Profile the workload's variants when asked, or by itself when memory is short (the
    message says so); ``None`` when not exploring."""
    from tuner.cli.display import LiveProgress
    from tuner.engine.explore import describe_variant, explore, should_explore

    if args.explore is False or not workload.variants:
        return None
    if args.explore is None:
        if not should_explore(profile):
            return None
        found = profile.max_micro_batch_size
        why = f"M* = {found} < 4" if found else "nothing fits"
        stderr.print(
            f"{why}: exploring the variants {workload.name} declares "
            f"({', '.join(workload.variants)}) to find the fastest that fits "
            "(--no-explore skips this)",
            highlight=False,
            soft_wrap=True,
        )

    def measure_variant(variant: Any) -> Profile:
        label = describe_variant(
            {k: variant.options[k] for k in variant.variants if k in variant.options}
        )
        stderr.print(f"profiling variant {label} ...", highlight=False)
        with LiveProgress(stderr) as progress:
            return measure(progress, variant)

    return explore(
        workload,
        measure_variant,
        global_batch_size=args.global_batch_size,
        world_size=args.world_size,
        done=profile,
    )


def _variant_summary(outcome: VariantOutcome, exploration: Exploration) -> VariantSummary:
    return VariantSummary(
        variant=outcome.options,
        variant_group=outcome.profile.variant_group,
        max_micro_batch_size=outcome.profile.max_micro_batch_size,
        recommendation=outcome.recommendation,
        samples_per_second=outcome.samples_per_second,
        samples_per_second_spread=outcome.spread,
        chosen=outcome is exploration.chosen,
    )


def _parallel_advice(
    profile: Profile, workload: Any, measure: Callable[[Any], Profile], stderr: Console
) -> list[str]:
    """What the parallel options cost, measured: DDP without bucket views is profiled again
    with them (and gradients zeroed in place) to say how much larger a micro batch fits;
    FSDP's gradient-sync style is named with what the other one would change."""
    parallel = profile.parallel
    if parallel.mode == "ddp" and not parallel.gradient_as_bucket_view:
        stderr.print("measuring gradient_as_bucket_view=true for comparison ...", highlight=False)
        workload.parallel = parallel.model_copy(update={"gradient_as_bucket_view": True})
        try:
            other = measure(None).max_micro_batch_size
        finally:
            workload.parallel = parallel
        gain = other - profile.max_micro_batch_size
        if gain > 0:
            return [
                f"DDP(gradient_as_bucket_view=True) with gradients zeroed in place fits micro "
                f"batch {other} (measured), {gain} more: DDP then keeps one copy of the "
                "gradients instead of two (--parallel-option gradient_as_bucket_view=true)"
            ]
        return [f"gradient_as_bucket_view=true measured {other}: no larger micro batch here"]
    if parallel.mode == "fsdp":
        if parallel.gradient_sync == "every":
            return [
                "FSDP reduce-scatters gradients after every micro batch (gradient_sync=every, "
                "the default: less memory); gradient_sync=last sends less but keeps unsharded "
                "gradients between micro batches"
            ]
        return [
            "FSDP syncs gradients on the last micro batch only (gradient_sync=last): unsharded "
            "gradients stay resident between micro batches; gradient_sync=every needs less "
            "memory"
        ]
    return []
