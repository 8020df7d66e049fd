"""``tuner profile``: probe a workload and find the largest micro batch that fits."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from tuner.cli.commands._args import (
    EXIT_FAILED,
    EXIT_NOTHING_FITS,
    EXIT_OK,
    headroom,
    memory,
    positive_int,
)
from tuner.core.errors import TunerError


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
        help="number of data-parallel ranks (default 1)",
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
        "--warmup-steps",
        type=positive_int,
        default=2,
        help="optimizer steps before measuring (default 2)",
    )
    profile.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout; messages go to stderr"
    )
    profile.add_argument(
        "--upload",
        action="store_true",
        help="store the profile in the service at TUNER_URL (token TUNER_TOKEN), print its id",
    )


def run(args: argparse.Namespace, stderr: Console) -> int:
    from tuner.core.plan import per_rank_batch, recommend

    if args.global_batch_size is not None:
        # Refused before importing torch, which alone takes a second or two.
        per_rank_batch(args.global_batch_size, args.world_size)

    # torch is imported here, not at module level, so `tuner --help` stays fast.
    import torch

    from tuner.cli.display import LiveProgress, print_profile
    from tuner.client import TunerClient
    from tuner.core.results import ProbeSettings
    from tuner.engine.backends import make_backend
    from tuner.engine.profiler import nothing_fits_advice, profile_workload
    from tuner.engine.workload import load_workload, parse_options

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = make_backend(device, memory_limit_bytes=args.memory_limit)
    workload = load_workload(args.target, parse_options(args.option))
    settings = ProbeSettings(warmup_steps=args.warmup_steps)
    # Made before probing, so that a missing TUNER_URL costs no profiling time.
    client = TunerClient() if args.upload else None
    try:
        with LiveProgress(stderr) as progress:
            profile = profile_workload(
                workload,
                backend,
                headroom=args.headroom,
                strategy=args.strategy,
                size_cap=args.size_cap,
                settings=settings,
                observer=progress,
            )
    except TunerError:
        raise
    except Exception:
        stderr.print_exception(max_frames=20)
        stderr.print(
            f"tuner profile: {args.target} raised an error that is not an out-of-memory; "
            "fix the workload and run again",
            highlight=False,
            markup=False,
        )
        return EXIT_FAILED

    found = profile.max_micro_batch_size
    recommendation = None
    if found and args.global_batch_size is not None:
        recommendation = recommend(
            max_micro_batch_size=found,
            probes=profile.probes,
            global_batch_size=args.global_batch_size,
            world_size=args.world_size,
        )
    uploaded, upload_error = None, None
    if client is not None:
        with client:
            try:
                uploaded = client.upload_profile(profile).id
            except TunerError as exc:
                upload_error = exc  # the profile is still printed: minutes of probing are kept
    if args.json:
        document = profile.model_dump(mode="json")
        if recommendation is not None:
            document["micro_batch_size"] = recommendation.micro_batch_size
            document["grad_accum"] = recommendation.grad_accum
            document["recommendation"] = recommendation.model_dump(mode="json")
        if uploaded is not None:
            document["profile_id"] = uploaded
        sys.stdout.write(json.dumps(document) + "\n")
    else:
        print_profile(Console(), profile, recommendation)
    if client is not None and uploaded is not None:
        (stderr if args.json else Console()).print(
            f"uploaded as profile {uploaded} to {client.url}", highlight=False, soft_wrap=True
        )
    if upload_error is not None:
        stderr.print(
            f"tuner profile: the profile was not uploaded: {upload_error.message}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return EXIT_FAILED
    if not found:
        stderr.print(nothing_fits_advice(profile, workload), highlight=False, markup=False)
        return EXIT_NOTHING_FITS
    return EXIT_OK
