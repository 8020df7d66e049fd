"""``tuner recommend``: ask the service for the micro batch and accumulation steps."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tuner.core import plan
from tuner.core.commands import EXIT_FAILED, EXIT_NOTHING_FITS, EXIT_OK, positive_int
from tuner.core.errors import NothingFitsError, ServiceUnavailableError
from tuner.core.parallel import PARALLEL_MODES, SIMULATED_RANKS_NOTE
from tuner.core.plan import DEFAULT_POLICY, POLICIES
from tuner.core.shape import MeshShape
from tuner.core.units import format_bytes

if TYPE_CHECKING:
    from tuner.core.wire.recommendation import RecommendationPublic


def add_parser(commands: Any) -> None:
    recommend = commands.add_parser(
        "recommend",
        help="ask the service for micro batch size and accumulation steps",
        description="global batch = micro batch × accumulation steps × world size / tp. Asks the "
        "service (TUNER_URL) for the settings that fit WORKLOAD on DEVICE.",
    )
    recommend.add_argument("--workload", required=True, help="workload key or name")
    recommend.add_argument("--device", required=True, help="device key or name")
    recommend.add_argument(
        "--global-batch-size",
        type=positive_int,
        required=True,
        help="samples per optimizer step across all ranks",
    )
    recommend.add_argument(
        "--world-size", type=positive_int, default=1, help="data-parallel ranks (default 1)"
    )
    recommend.add_argument(
        "--tp",
        type=positive_int,
        default=1,
        help="tensor-parallel ranks of a 2-D FSDP mesh: the --world-size ranks as "
        "(world/tp) × tp, the global batch split over world/tp groups (default 1: no mesh)",
    )
    recommend.add_argument(
        "--parallel",
        choices=PARALLEL_MODES,
        default=None,
        help="how the run spreads over its ranks (default: the workload's own mode); ddp and "
        "fsdp are answered from profiles measured that way",
    )
    recommend.add_argument(
        "--seq-len",
        type=positive_int,
        default=None,
        help="tokens per sequence: measured where the workload's length family profiled it, "
        "estimated between and near the measured lengths (0.5x the shortest to 1.25x the "
        "longest)",
    )
    recommend.add_argument(
        "--tokens-per-micro-batch",
        type=positive_int,
        default=None,
        help="packed sequences: the tokens each micro batch is filled with (a multiple of "
        "--seq-len); refused, with the budget that fits, when it does not",
    )
    recommend.add_argument(
        "--policy",
        choices=POLICIES,
        default=DEFAULT_POLICY,
        help="balanced: the fewest micro batches that fit, sizes within one of each other "
        "(default); max: largest fitting micro batch first, the remainder last; even: the best "
        "equal split (micro batches of one size); throughput: fastest measured",
    )
    recommend.add_argument(
        "--project",
        default=None,
        help="the project whose profiles answer (default: TUNER_PROJECT, else the token's own)",
    )
    recommend.add_argument("--url", default=None, help="service URL (default: TUNER_URL)")
    recommend.add_argument("--token", default=None, help="API token (default: TUNER_TOKEN)")
    recommend.add_argument(
        "--json", action="store_true", help="print the whole answer as one JSON object"
    )


def run(args: argparse.Namespace, stderr: Console) -> int:
    from tuner.client import TunerClient
    from tuner.core.wire.recommendation import RecommendationQuery

    # The one question every surface asks (each of its fields is a flag of this command),
    # checked here as the service checks it.
    query = RecommendationQuery.read(
        {name: getattr(args, name) for name in RecommendationQuery.model_fields}
    )
    with TunerClient(args.url, token=args.token) as client:
        try:
            answer = client.ask(query)
        except NothingFitsError as exc:
            stderr.print(
                f"tuner recommend: {exc.message}", highlight=False, markup=False, soft_wrap=True
            )
            return EXIT_NOTHING_FITS
        except ServiceUnavailableError as exc:
            # The client's own message tells a program to pass fallback=, which a person at
            # the command line cannot: say what they can do.
            cause = exc.__cause__
            reason = cause.message if isinstance(cause, ServiceUnavailableError) else exc.message
            stderr.print(
                f"tuner recommend: {reason}; no earlier answer to this question is cached: "
                "start the service or give its address with --url (or TUNER_URL), then ask "
                "again",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
            return EXIT_FAILED
    if args.json:
        sys.stdout.write(answer.model_dump_json() + "\n")
        return EXIT_OK
    print(answer.describe())
    print(answer.reason)
    equal = equal_line(answer)
    if equal is not None:
        print(equal)
    if answer.equal.warning is not None:
        print(f"caution: {answer.equal.warning}")
    if answer.seq_len is not None:
        print(_tokens(answer))
    source = _source(answer)
    print(
        f"{answer.workload_name} on {answer.device_name}: {source}, "
        f"{_age(answer.profile_age_s)} old"
    )
    numbers = []
    if answer.expected_peak_bytes is not None:
        numbers.append(f"expected peak {format_bytes(answer.expected_peak_bytes)}")
    if answer.expected_headroom_bytes is not None:
        numbers.append(f"headroom {format_bytes(answer.expected_headroom_bytes)}")
    if answer.expected_samples_per_second is not None:
        spread = answer.expected_speed_spread
        numbers.append(
            f"{answer.expected_samples_per_second:.1f} samples/s"
            + (f" ±{spread:.0%}" if spread is not None else "")
        )
    print(
        f"{answer.basis}: " + ", ".join(numbers)
        if numbers
        else f"{answer.basis}: no peak or speed is known for this size"
    )
    if answer.caveat is not None:
        print(f"caution: {answer.caveat}")
    if answer.profile_simulated_ranks:
        print(f"simulated ranks: {SIMULATED_RANKS_NOTE}; no speed is quoted")
    if answer.oom_limit is not None:
        print(
            f"kept below micro batch {answer.oom_limit}, which ran out of memory in training; "
            "a newer profile lifts this"
        )
    return EXIT_OK


def equal_line(answer: plan.Recommendation) -> str | None:
    """What a framework that runs equal micro batches only (the Hugging Face Trainer,
    Lightning) trains, where the answer's split is not equal already."""
    if answer.is_equal:
        return None
    equal = answer.equal
    speed = ""
    if equal.expected_samples_per_second is not None:
        estimated = ", estimated" if equal.speed_basis == "estimated" else ""
        speed = f", {equal.expected_samples_per_second:.1f} samples/s{estimated}"
        if equal.slower_by is not None and equal.slower_by > 0:
            speed += f", {equal.slower_by:.0%} slower"
    return f"equal micro batches (Trainer, Lightning): {equal.headline}{speed}"


def _source(answer: RecommendationPublic) -> str:
    """Which profiles the numbers come from, and how they were measured."""
    measured = MeshShape(answer.profile_world_size, answer.profile_tp)
    mesh = f" as {measured}" if measured.is_mesh else ""
    ranks = (
        f" ({answer.profile_parallel} on {answer.profile_world_size} ranks{mesh})"
        if answer.profile_parallel != "none"
        else " (one process)"
        if answer.parallel != "none"
        else ""
    )
    if answer.basis == "measured":
        return f"measured by profile {answer.profile_id}{ranks}"
    if answer.length_basis == "estimated":
        profiles = ", ".join(map(str, answer.based_on_profiles))
        return f"estimated across sequence lengths from profiles {profiles}"
    if len(answer.based_on_profiles) > 1:
        error = f", fit within {answer.expected_error:.1%}" if answer.expected_error else ""
        profiles = ", ".join(map(str, answer.based_on_profiles))
        across = "mesh shapes" if answer.mesh.is_mesh or measured.is_mesh else "world sizes"
        return f"estimated across {across} from profiles {profiles}{error}"
    if answer.profile_device_key != answer.device_key:
        return (
            f"estimated from profile {answer.profile_id}{ranks} on device "
            f"{answer.profile_device_key}"
        )
    return f"estimated from profile {answer.profile_id}{ranks}"


def _tokens(answer: RecommendationPublic) -> str:
    """The answer in tokens, and which lengths it rests on."""
    tokens = (
        f"seq_len {answer.seq_len}: {answer.tokens_per_micro_batch:,} tokens per micro batch, "
        f"at most {answer.max_tokens_per_micro_batch:,}"
    )
    if answer.length_basis == "estimated":
        lengths = ", ".join(map(str, answer.measured_seq_lens))
        error = f", fit within {answer.expected_error:.1%}" if answer.expected_error else ""
        return f"{tokens} (estimated from seq_len {lengths}{error})"
    return f"{tokens} (measured)"


def _age(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{int(seconds)} seconds"
