"""The ``tuner`` command.

Exit statuses: 0 found, 1 the workload itself raised, 2 bad input, 3 nothing fits.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from rich.console import Console

from tuner.errors import BadInputError, TunerError
from tuner.units import parse_bytes

EXIT_OK, EXIT_WORKLOAD_FAILED, EXIT_BAD_INPUT, EXIT_NOTHING_FITS = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line that says what to do, instead of argparse's usage dump.
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive whole number")
    return value


def _headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"headroom {text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(
            f"headroom {value} is outside [0, 1): "
            "give the fraction of memory to keep free, e.g. 0.05"
        )
    return value


def _memory(text: str) -> int:
    try:
        return parse_bytes(text)
    except BadInputError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tuner", description="Find the largest micro batch that fits, and use it."
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
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
        type=_memory,
        default=None,
        help="memory to fit in, e.g. 2GiB; needed on cpu, emulates a smaller GPU on cuda",
    )
    profile.add_argument(
        "--headroom",
        type=_headroom,
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
        type=_positive_int,
        default=4096,
        help="largest micro batch size to consider (default 4096)",
    )
    profile.add_argument(
        "--global-batch-size",
        type=_positive_int,
        default=None,
        help="samples per optimizer step across all ranks: also recommend settings",
    )
    profile.add_argument(
        "--world-size",
        type=_positive_int,
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
        type=_positive_int,
        default=2,
        help="optimizer steps before measuring (default 2)",
    )
    profile.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout; messages go to stderr"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stderr = Console(stderr=True)
    try:
        if args.command == "profile":
            return _profile(args, stderr)
    except BadInputError as exc:
        stderr.print(f"tuner {args.command}: {exc.message}", highlight=False, markup=False)
        return EXIT_BAD_INPUT
    except TunerError as exc:
        stderr.print(f"tuner {args.command}: {exc.message}", highlight=False, markup=False)
        return EXIT_WORKLOAD_FAILED
    raise AssertionError(f"unhandled command {args.command}")


def _profile(args: argparse.Namespace, stderr: Console) -> int:
    # torch is imported here, not at module level, so `tuner --help` stays fast.
    import torch

    from tuner.backends import make_backend
    from tuner.display import LiveProgress, print_profile
    from tuner.plan import per_rank_batch, recommend
    from tuner.profiler import nothing_fits_advice, profile_workload
    from tuner.results import ProbeSettings
    from tuner.workload import load_workload, parse_options

    if args.global_batch_size is not None:
        per_rank_batch(args.global_batch_size, args.world_size)  # refuse B % W before probing
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = make_backend(device, memory_limit_bytes=args.memory_limit)
    workload = load_workload(args.target, parse_options(args.option))
    settings = ProbeSettings(warmup_steps=args.warmup_steps)
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
        return EXIT_WORKLOAD_FAILED

    found = profile.max_micro_batch_size
    recommendation = None
    if found and args.global_batch_size is not None:
        recommendation = recommend(
            max_micro_batch_size=found,
            probes=profile.probes,
            global_batch_size=args.global_batch_size,
            world_size=args.world_size,
        )
    if args.json:
        document = profile.model_dump(mode="json")
        if recommendation is not None:
            document["micro_batch_size"] = recommendation.micro_batch_size
            document["grad_accum"] = recommendation.grad_accum
            document["recommendation"] = recommendation.model_dump(mode="json")
        sys.stdout.write(json.dumps(document) + "\n")
    else:
        print_profile(Console(), profile, recommendation)
    if not found:
        stderr.print(nothing_fits_advice(profile, workload), highlight=False, markup=False)
        return EXIT_NOTHING_FITS
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
